"""Timing one case: every scope, the yardsticks, and each time against its time floor.

``run_case`` calls ``time_case`` for a ``timed`` case *after* judging it, on fresh inputs, so
no timing ever runs inside the numeric comparison. Rows produced (``TimingResult.scope``):

- ``kernel`` / ``kernel.bwd`` (or ``kernel~op``), ``op`` / ``op.bwd`` (updates: ``op`` in modes
  ``reset`` and ``advance``), ``subgraph`` (``convmatrix.runners.case.timing.scopes``,
  ``.subgraph``);
- ``framework``: the framework path's (``torch``) public call on the same case, side by side
  (absent when the kernel under test is the framework path itself);
- ``memcpy``: a copy moving the case's D bytes, the yardstick of the time floor.s memory term;
- ``fma``, ``gemm``: this process's compute calibration
(``convmatrix.runners.case.timing.calibrate``).

For every kernel, op, subgraph and framework row: ``flops``/``bytes_moved`` from the model,
``floor_s = max(F / P_eff, t_memcpy(D))`` (the memory term is the measured copy of the same D
bytes, ``D / BW_eff`` with ``BW_eff`` measured at that size; P_eff the element-wise FMA rate,
for the subgraph's dense layers the GEMM rate) and ``efficiency = floor / median``.

On the cpu device under the default ``process`` clock (``devices.cpu_clock``) a case is
timed with one intra-op thread: the CPU time of a call is then its latency on one core, and no
other thread's spinning is counted.

The scopes of a case are timed *interleaved*: each is warmed up, then every round calls each
scope once, so all of them (the framework control and the memcpy included) see the same
machine load. On a shared machine the load moves by tens of percent within seconds; timed one
after the other, two scopes of the same work were seen 30% apart, interleaved they agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.devices import cpu_clock, synchronize, timer
from convmatrix.core.records import TimingResult
from convmatrix.matrix.spec import TimingSettings
from convmatrix.runners.case.inputs import build_forward, build_update
from convmatrix.runners.case.timing.calibrate import calibration, copy_bytes, copy_call, time_copy
from convmatrix.runners.case.timing.measure import Sampling, summarize, time_once, warm_up
from convmatrix.runners.case.timing.perfmodel import Work, efficiency, work_of
from convmatrix.runners.case.timing.scopes import Timed, kernel_scopes, op_scopes
from convmatrix.runners.case.timing.subgraph import subgraph_scope

__all__ = ["measure_interleaved", "sampling_for", "time_case", "timing_threads"]


def sampling_for(settings: TimingSettings) -> Sampling:
    """The matrix's ``timing:`` as a ``Sampling``: at least ``warmup`` warm-up calls (more, up
    to 4x, until three agree within 10%), at least ``repeats`` repetitions and more until
    ``budget_s`` of measured time per scope (at most 10x ``repeats``)."""
    return Sampling(
        warmup_min=max(1, settings.warmup),
        warmup_max=max(1, 4 * settings.warmup),
        repeats_min=settings.repeats,
        repeats_max=max(settings.repeats, 10 * settings.repeats),
        budget_s=settings.budget_s,
    )


def _inputs(case: Case, device: torch.device, kernel: Any) -> Any:
    """Fresh inputs as ``kernel`` takes them (its declared slot convention)."""
    if case.op == "update":
        return build_update(case, device, kernel.capabilities)
    return build_forward(case, device)


class _Floors:
    """Lower floors of one case: ``max(F / P_eff, t_copy(D))``, one copy timing per D; the
    flops of work with dense layers (the subgraph) at the GEMM rate."""

    def __init__(self, device: torch.device, compute: float, dense: float) -> None:
        self.device, self.compute, self.dense = device, compute, dense
        self.copies: dict[float, TimingResult] = {}

    def copy(self, nbytes: float) -> TimingResult:
        if nbytes not in self.copies:
            self.copies[nbytes] = time_copy(self.device, nbytes)
        return self.copies[nbytes]

    def of(self, work: Work, dense: bool = False) -> float:
        memory = self.copy(work.bytes).median_s if work.bytes > 0 else 0.0
        return max(work.flops / (self.dense if dense else self.compute), memory)


def measure_interleaved(
    items: Sequence[Timed], device: torch.device, sampling: Sampling
) -> list[TimingResult]:
    """Warm each item up (its cold call kept apart), then time them in rounds: each round calls
    every item that still wants samples (fewer than ``repeats_min``, or under ``budget_s`` of
    measured time and ``repeats_max`` calls)."""
    sync, new_timer = partial(synchronize, device), partial(timer, device)
    calls = [partial(time_once, t.fn, sync, new_timer, t.setup) for t in items]
    colds = [warm_up(call, sampling) for call in calls]
    samples: list[list[float]] = [[] for _ in items]

    def wants(s: list[float]) -> bool:
        more = sum(s) < sampling.budget_s and len(s) < sampling.repeats_max
        return len(s) < sampling.repeats_min or more

    while active := [i for i, s in enumerate(samples) if wants(s)]:
        for i in active:
            samples[i].append(calls[i]())
    results = []
    for item, cold, s in zip(items, colds, samples, strict=True):
        median, low, iqr = summarize(s)
        results.append(TimingResult(item.scope, median, low, iqr, len(s), cold, s, item.mode))
    return results


def _with_floor(result: TimingResult, item: Timed, floors: _Floors) -> TimingResult:
    work, floor = item.work, floors.of(item.work, item.dense)
    return replace(
        result, flops=float(work.flops), bytes_moved=float(work.bytes), floor_s=floor,
        efficiency=efficiency(floor, result.median_s),
    )  # fmt: skip


def _scopes(kernel: Any, framework: Any, case: Case, device: torch.device) -> list[Timed]:
    """Every scope, each on its own fresh inputs (an update scope mutates its state pool)."""
    timed = kernel_scopes(kernel, case, _inputs(case, device, kernel))
    timed += op_scopes(kernel, case, _inputs(case, device, kernel))
    timed.append(subgraph_scope(kernel, case, _inputs(case, device, kernel)))
    if framework is not None and type(framework) is not type(kernel):
        for item in op_scopes(framework, case, _inputs(case, device, framework)):
            if item.scope == "op":
                timed.append(replace(item, scope="framework"))
    return timed


@contextmanager
def timing_threads(device: torch.device) -> Iterator[None]:
    """One intra-op thread while timing on cpu with the process clock (else no change)."""
    if device.type != "cpu" or cpu_clock() != "process":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_case(
    kernel: Any,
    case: Case,
    device: torch.device,
    settings: TimingSettings,
    framework: Any = None,
) -> list[TimingResult]:
    """Every timing row of ``case`` (see the module docstring), in scope order."""
    with timing_threads(device):
        return _time_case(kernel, case, device, settings, framework)


def _time_case(
    kernel: Any, case: Case, device: torch.device, settings: TimingSettings, framework: Any
) -> list[TimingResult]:
    sampling = sampling_for(settings)
    cal = calibration(device)
    floors = _Floors(device, cal.rates.compute, cal.dense)
    work = work_of(case)
    items = _scopes(kernel, framework, case, device)
    copy = Timed("memcpy", copy_call(device, work.bytes), Work(0.0, work.bytes))
    measured = measure_interleaved([*items, copy], device, sampling)
    # The interleaved copy of D bytes is the yardstick row and the time floor of the conv's own D.
    yard = replace(measured[-1], flops=0.0, bytes_moved=float(copy_bytes(work.bytes)))
    floors.copies[work.bytes] = yard
    rows = [_with_floor(r, t, floors) for r, t in zip(measured, items, strict=False)]
    streaming = yard.bytes_moved / cal.rates.bandwidth if yard.bytes_moved else None
    yardstick = efficiency(streaming, yard.median_s) if streaming else None
    return [*rows, replace(yard, floor_s=streaming, efficiency=yardstick), cal.fma, cal.gemm]
