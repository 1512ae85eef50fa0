"""Timing one case: every scope, the yardsticks, and each time against its lower bound.

``run_case`` calls ``time_case`` for a ``timed`` case *after* judging it, on fresh inputs, so
no timing ever runs inside the numeric comparison. Rows produced (``TimingResult.scope``):

- ``kernel`` / ``kernel.bwd`` (or ``kernel~op``), ``op`` / ``op.bwd`` (updates: ``op`` in modes
  ``reset`` and ``advance``), ``subgraph`` (``convmatrix.runners.scopes``, ``.subgraph``);
- ``framework``: the framework path's (``torch``) public call on the same case, side by side
  (absent when the kernel under test is the framework path itself);
- ``memcpy``: a copy moving the case's D bytes, the yardstick of the bound's memory term;
- ``fma``: this process's compute calibration (``convmatrix.runners.calibrate``).

For every kernel, op, subgraph and framework row: ``flops``/``bytes_moved`` from the model,
``bound_s = max(F / P_eff, t_memcpy(D))`` (the memory term is the measured copy of the same D
bytes, ``D / BW_eff`` with ``BW_eff`` measured at that size) and ``efficiency = bound / median``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from convmatrix.matrix.case import Case
from convmatrix.matrix.spec import TimingSettings
from convmatrix.runners.calibrate import calibration, time_copy
from convmatrix.runners.inputs import build_forward, build_update
from convmatrix.runners.perfmodel import Work, efficiency, work_of
from convmatrix.runners.results import TimingResult
from convmatrix.runners.scopes import Timed, kernel_scopes, op_scopes
from convmatrix.runners.subgraph import subgraph_scope
from convmatrix.runners.timing import TimingPlan, measure_on

__all__ = ["plan_for", "time_case"]


def plan_for(settings: TimingSettings) -> TimingPlan:
    """The matrix's ``timing:`` as a ``TimingPlan``: at least ``warmup`` warm-up calls (more, up
    to 4x, until three agree within 10%), at least ``repeats`` repetitions and more until
    ``budget_s`` of measured time per scope (at most 10x ``repeats``)."""
    return TimingPlan(
        warmup_min=max(1, settings.warmup),
        warmup_max=max(1, 4 * settings.warmup),
        repeats_min=settings.repeats,
        repeats_max=max(settings.repeats, 10 * settings.repeats),
        budget_s=settings.budget_s,
    )


def _inputs(case: Case, device: torch.device) -> Any:
    return build_update(case, device) if case.op == "update" else build_forward(case, device)


class _Bounds:
    """Lower bounds of one case: ``max(F / P_eff, t_copy(D))``, one copy timing per D."""

    def __init__(self, device: torch.device, compute: float) -> None:
        self.device, self.compute = device, compute
        self.copies: dict[float, TimingResult] = {}

    def copy(self, nbytes: float) -> TimingResult:
        if nbytes not in self.copies:
            self.copies[nbytes] = time_copy(self.device, nbytes)
        return self.copies[nbytes]

    def of(self, work: Work) -> float:
        memory = self.copy(work.bytes).median_s if work.bytes > 0 else 0.0
        return max(work.flops / self.compute, memory)


def _measure(item: Timed, device: torch.device, plan: TimingPlan, bounds: _Bounds) -> TimingResult:
    result = measure_on(device, item.fn, plan, setup=item.setup, scope=item.scope, mode=item.mode)
    bound = bounds.of(item.work)
    return replace(
        result, flops=float(item.work.flops), bytes_moved=float(item.work.bytes), bound_s=bound,
        efficiency=efficiency(bound, result.median_s),
    )  # fmt: skip


def _scopes(kernel: Any, framework: Any, case: Case, device: torch.device) -> list[Timed]:
    """Every scope, each on its own fresh inputs (an update scope mutates its state pool)."""
    timed = kernel_scopes(kernel, case, _inputs(case, device))
    timed += op_scopes(kernel, case, _inputs(case, device))
    timed.append(subgraph_scope(kernel, case, _inputs(case, device)))
    if framework is not None and type(framework) is not type(kernel):
        for item in op_scopes(framework, case, _inputs(case, device)):
            if item.scope == "op":
                timed.append(replace(item, scope="framework"))
    return timed


def time_case(
    kernel: Any,
    case: Case,
    device: torch.device,
    settings: TimingSettings,
    framework: Any = None,
) -> list[TimingResult]:
    """Every timing row of ``case`` (see the module docstring), in scope order."""
    plan = plan_for(settings)
    cal = calibration(device)
    bounds = _Bounds(device, cal.rates.compute)
    rows = [_measure(t, device, plan, bounds) for t in _scopes(kernel, framework, case, device)]
    copy = bounds.copy(work_of(case).bytes)
    streaming = copy.bytes_moved / cal.rates.bandwidth if copy.bytes_moved else None
    yardstick = efficiency(streaming, copy.median_s) if streaming else None
    return [*rows, replace(copy, bound_s=streaming, efficiency=yardstick), cal.fma]
