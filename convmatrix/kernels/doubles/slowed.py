"""A kernel made slower on purpose: the planted regression for the timing detector.

``SlowedKernel(base, factor)`` computes exactly what ``base`` computes and then spends
``(factor - 1)`` times the time the call took (``spend``), so every scope of it (core, public
call, backward, decode update) takes ``factor`` times as long as the base kernel's call,
whatever the machine's load. "Time" is the clock timings use (``devices.cpu_clock``): under the
default process CPU clock the extra time is spun (a sleep costs no CPU time), under the wall
clock it is slept. The backward is slowed too: the outputs carry a marker node that notes when
autograd reaches them, and the inputs a node that spends once the base kernel's backward has
produced their gradients.

Load it as ``--kernel 'convmatrix.kernels.doubles.slowed:make(base=tiled,percent=150)'`` (a factor
of 1.5; the spec syntax has no room for a decimal point). ``convmatrix diff`` of a run of ``base``
against a run of this kernel must report timing regressions; ``benchmarks/bench_timing_aa.py``
measures how often it does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from convmatrix.core.errors import UsageError
from convmatrix.kernels.interface.corecall import CoreArgs, CoreCall, core_call_of
from convmatrix.kernels.interface.protocol import KernelBase

__all__ = ["SlowedKernel", "make", "now", "spend"]


def _process_clock(device: torch.device | None) -> bool:
    """CPU work under the process clock; device work (events time it) by the wall clock."""
    if device is not None and device.type != "cpu":
        return False
    from convmatrix.core.devices import cpu_clock

    return cpu_clock() == "process"


def now(device: torch.device | None = None) -> float:
    """The timing clock's reading: process CPU time, or wall time after waiting for the
    device's queued work (a device's events time the device, which the host must wait for)."""
    if _process_clock(device):
        return time.process_time()
    if device is not None and device.type != "cpu":
        from convmatrix.core.devices import synchronize

        synchronize(device)
    return time.perf_counter()


def spend(seconds: float, device: torch.device | None = None) -> None:
    """Take ``seconds`` more of the timing clock: spin on the process clock, sleep otherwise
    (a device's end event is recorded after the sleep, so its timing includes it)."""
    if seconds <= 0:
        return
    if not _process_clock(device):
        time.sleep(seconds)
        return
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _device_of(*values: Any) -> torch.device | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None


class _Clock:
    """When autograd reached the outputs (None again once the inputs spent for it)."""

    def __init__(self) -> None:
        self.start: float | None = None


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, clock, t):  # type: ignore[override]
        ctx.clock = clock
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.clock.start is None:
            ctx.clock.start = now(grad.device)
        return None, grad


class _Spend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, clock, factor, t):  # type: ignore[override]
        ctx.clock, ctx.factor = clock, factor
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        clock = ctx.clock
        if clock.start is not None:
            spend((ctx.factor - 1) * (now(grad.device) - clock.start), grad.device)
            clock.start = None  # the other inputs of this call do not spend again
        return None, None, grad


class SlowedKernel(KernelBase):
    """``base`` running ``factor`` times slower (see the module docstring)."""

    def __init__(self, base: Any, factor: float = 1.5) -> None:
        if factor < 1:
            raise UsageError(f"slowed kernel: factor {factor} must be >= 1")
        self.base, self.factor = base, factor
        self.name = f"{base.name} (x{factor:g} slowed)"
        self.capabilities = base.capabilities

    def _slow(self, fn: Any, *args: Any, device: torch.device | None = None, **kwargs: Any) -> Any:
        device = device or _device_of(*args, *kwargs.values())
        start = now(device)
        out = fn(*args, **kwargs)
        spend((self.factor - 1) * (now(device) - start), device)
        return out

    def forward(self, x, weight, bias=None, **kwargs):  # type: ignore[override]
        inputs = [x, weight, bias, kwargs.get("initial_state")]
        if not torch.is_grad_enabled() or not any(
            t is not None and t.requires_grad for t in inputs
        ):
            return self._slow(self.base.forward, x, weight, bias, **kwargs)
        clock = _Clock()

        def spending(t: torch.Tensor | None) -> torch.Tensor | None:
            return t if t is None or not t.requires_grad else _Spend.apply(clock, self.factor, t)

        x, weight, bias = spending(x), spending(weight), spending(bias)
        if kwargs.get("initial_state") is not None:
            kwargs["initial_state"] = spending(kwargs["initial_state"])
        out = self._slow(self.base.forward, x, weight, bias, **kwargs)
        if isinstance(out, tuple):
            return tuple(_Mark.apply(clock, t) for t in out)
        return _Mark.apply(clock, out)

    def update(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._slow(self.base.update, *args, **kwargs)

    def core_call(self, args: CoreArgs) -> CoreCall | None:
        hook = core_call_of(self.base)
        inner = None if hook is None else hook(args)
        return None if inner is None else (lambda: self._slow(inner, device=args.x.device))

    def availability(self) -> str | None:
        return self.base.availability()

    def contract_violation(self, case: Any) -> str | None:
        return self.base.contract_violation(case)

    def describe(self) -> Mapping[str, Any]:
        describe = getattr(self.base, "describe", None)
        base = dict(describe()) if callable(describe) else {}
        return {**base, "name": self.name, "slowed_by": self.factor}


def make(base: str = "tiled", percent: int = 150) -> SlowedKernel:
    """``base`` (a registered name) at ``percent`` % of its time (150: 1.5x slower)."""
    from convmatrix.kernels.interface.registry import load

    return SlowedKernel(load(base), percent / 100)


def __getattr__(name: str) -> Any:
    """``make(base=tiled,percent=150)`` attribute specs for ``--kernel``."""
    if name.startswith("make(") and name.endswith(")"):
        from convmatrix.kernels.builtin.tiled import _parse_call

        return make(**_parse_call(name[len("make(") : -1]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
