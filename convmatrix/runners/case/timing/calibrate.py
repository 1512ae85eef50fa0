"""Effective rates of the device a process times on: the yardsticks of the performance model.

docs/spec.md §5: ``t >= max(F / P_eff, D / BW_eff)`` with *measured* rates, never sheet numbers.

- ``time_copy(device, D)``: a copy whose traffic is D bytes (D/2 read, D/2 written, into a
  preallocated buffer: page faults of a fresh allocation are not bandwidth). Dao's maintainers
  call their kernel "as fast as a memcpy": this is that yardstick, per case, at the case's own
  D, so cache residency and per-call launch cost at that size are in it.
- ``time_fma(device)``: fp32 fused multiply-adds on a 256 KiB buffer that stays in cache, so the
  rate is arithmetic, not memory, bound.
- ``time_gemm(device)``: an fp32 256^3 matrix product, the rate dense layers reach (the
  subgraph's in_proj/out_proj): far above the element-wise rate on a CPU with wide FMA units,
  so a bound on work that includes them must use it or it is no lower bound.
- ``calibration(device)``: all measured once per process and device (a worker measures its
  own, under its own thread count) and cached: the device's streaming bandwidth (a copy moving
  256 MiB), P_eff (element-wise) and the dense rate. Every timed case stores the ``fma`` and
  ``gemm`` rows and its ``memcpy`` row beside its scopes, so a stored timing carries the rates
  its efficiency was computed with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from convmatrix.core.devices import cpu_clock
from convmatrix.core.records import TimingResult
from convmatrix.runners.case.timing.measure import Sampling, measure_on
from convmatrix.runners.case.timing.perfmodel import Rates

__all__ = [
    "CALIBRATION_SCOPES",
    "COPY_SAMPLING",
    "Calibration",
    "calibration",
    "copy_bytes",
    "copy_call",
    "rates_of",
    "time_copy",
    "time_fma",
    "time_gemm",
]

# Scopes of the yardstick rows: stored beside the kernel's timings, never judged as the kernel.
CALIBRATION_SCOPES = ("memcpy", "fma", "gemm")
COPY_SAMPLING = Sampling(
    warmup_min=2, warmup_max=10, repeats_min=10, repeats_max=200, budget_s=0.05
)
DEVICE_COPY_BYTES = 256 << 20  # traffic; 128 MiB a side is past any last-level cache
_FMA_ELEMENTS, _FMA_ROUNDS = 1 << 16, 16
_GEMM_N = 256
_CACHE: dict[str, Calibration] = {}


def copy_bytes(nbytes: float) -> int:
    """The traffic ``copy_call(nbytes)`` really moves: ``nbytes`` rounded up to 8 bytes."""
    return 8 * max(1, -(-int(nbytes) // 8))


def copy_call(device: torch.device | str, nbytes: float) -> Callable[[], object]:
    """A copy whose traffic (read + write) is ``copy_bytes(nbytes)``, into a preallocated
    buffer."""
    src = torch.ones(copy_bytes(nbytes) // 8, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def time_copy(
    device: torch.device | str, nbytes: float, sampling: Sampling = COPY_SAMPLING
) -> TimingResult:
    """Time ``copy_call(device, nbytes)``: scope ``memcpy``, ``bytes_moved`` its traffic."""
    result = measure_on(device, copy_call(device, nbytes), sampling, scope="memcpy")
    return replace(result, flops=0.0, bytes_moved=float(copy_bytes(nbytes)))


def time_fma(device: torch.device | str, sampling: Sampling = COPY_SAMPLING) -> TimingResult:
    """Time rounds of ``addcmul_`` on a cache-resident fp32 buffer (2 flops per element)."""
    a = torch.full((_FMA_ELEMENTS,), 0.5, dtype=torch.float32, device=device)
    acc = torch.zeros_like(a)

    def fma() -> None:
        for _ in range(_FMA_ROUNDS):
            acc.addcmul_(a, a)

    result = measure_on(device, fma, sampling, scope="fma")
    return replace(result, flops=float(2 * _FMA_ELEMENTS * _FMA_ROUNDS), bytes_moved=0.0)


def time_gemm(device: torch.device | str, sampling: Sampling = COPY_SAMPLING) -> TimingResult:
    """Time an fp32 (256 x 256) @ (256 x 256) product (2 * 256^3 flops), operands in cache."""
    n = _GEMM_N
    a = torch.full((n, n), 0.5, dtype=torch.float32, device=device)
    out = torch.empty_like(a)
    result = measure_on(device, lambda: torch.mm(a, a, out=out), sampling, scope="gemm")
    return replace(result, flops=float(2 * n**3), bytes_moved=0.0)


@dataclass(frozen=True)
class Calibration:
    """A process's measured rates and the timings they come from."""

    rates: Rates
    copy: TimingResult  # the streaming copy of DEVICE_COPY_BYTES
    fma: TimingResult
    gemm: TimingResult

    @property
    def dense(self) -> float:
        """flop/s of dense matrix products (their fastest call), at least the element-wise
        rate: the compute rate a bound on work that includes dense layers must use."""
        assert self.gemm.flops
        return max(self.gemm.flops / self.gemm.min_s, self.rates.compute)


def rates_of(copy: TimingResult, fma: TimingResult) -> Rates:
    """Rates from a copy timing (bytes_moved set) and an fma timing (flops set), by their
    fastest repetition: what the device reaches. On a shared machine a burst of load during
    the one-off calibration inflates every median after it, never the minimum."""
    assert copy.bytes_moved and fma.flops, "time_copy / time_fma results carry their work"
    return Rates(bandwidth=copy.bytes_moved / copy.min_s, compute=fma.flops / fma.min_s)


def calibration(device: torch.device | str, nbytes: int = DEVICE_COPY_BYTES) -> Calibration:
    """The rates of ``device`` in this process: measured on first use, then cached (per clock
    and thread count: ``cases.time_case`` calls it single-threaded under the process clock)."""
    key = f"{torch.device(device)}:{nbytes}:{cpu_clock()}:{torch.get_num_threads()}"
    if key not in _CACHE:
        sampling = Sampling(repeats_min=5, repeats_max=50, budget_s=0.2)
        copy, fma = time_copy(device, nbytes, sampling), time_fma(device, sampling)
        _CACHE[key] = Calibration(rates_of(copy, fma), copy, fma, time_gemm(device, sampling))
    return _CACHE[key]
