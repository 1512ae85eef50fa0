"""Honest timings: synchronise at the boundaries, warm up, keep the cold call apart, repeat.

Devices run asynchronously: a host clock read right after a launch measures the launch, not the
work. Every region here is bracketed by ``synchronize`` (CPU clock) or by device events, the
first (compile/allocation) call is recorded as ``cold_s`` and never mixed into the steady
state, warm-up runs until three consecutive samples agree within ``stable_rel`` (bounded by
``warmup_max``), and repetitions run until ``budget_s`` of measured time or ``repeats_max``,
never fewer than ``repeats_min``.

Updates are timed in one of two declared modes (SPEC.md §5): ``reset`` restores the same state
before each repetition, outside the timed region; ``advance`` lets one request keep advancing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from convmatrix.runners.devices import synchronize, timer
from convmatrix.runners.results import TimingResult

__all__ = ["TimingPlan", "measure", "measure_on", "summarize", "time_once", "warm_up"]


@dataclass(frozen=True)
class TimingPlan:
    warmup_min: int = 2
    warmup_max: int = 20
    stable_rel: float = 0.10
    repeats_min: int = 7
    repeats_max: int = 200
    budget_s: float = 0.25


def summarize(samples: list[float]) -> tuple[float, float, float]:
    """(median, min, interquartile range) of a non-empty sample list."""
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return statistics.median(ordered), ordered[0], q3 - q1


def time_once(
    fn: Callable[[], object],
    sync: Callable[[], None],
    new_timer: Callable[[], object],
    setup: Callable[[], None] | None = None,
) -> float:
    """One timed call: ``setup`` (untimed), then ``fn`` bracketed by synchronisation."""
    if setup is not None:
        setup()
    clock = new_timer()
    sync()
    clock.start()  # type: ignore[attr-defined]
    fn()
    sync()
    return clock.stop()  # type: ignore[attr-defined]


def warm_up(once: Callable[[], float], plan: TimingPlan) -> float:
    """The cold call's time, after which calls repeat until three agree (bounded)."""
    cold = once()
    recent: list[float] = []
    for i in range(plan.warmup_max):
        recent = [*recent[-2:], once()]
        if i + 1 >= plan.warmup_min and len(recent) == 3:
            lo, hi = min(recent), max(recent)
            if hi - lo <= plan.stable_rel * max(lo, 1e-12):
                break
    return cold


def measure(
    fn: Callable[[], object],
    *,
    sync: Callable[[], None],
    new_timer: Callable[[], object],
    plan: TimingPlan = TimingPlan(),
    setup: Callable[[], None] | None = None,
    scope: str = "op",
    mode: str | None = None,
) -> TimingResult:
    """Time ``fn`` per ``plan``; ``setup`` runs before each call, outside the timed region."""

    def once() -> float:
        return time_once(fn, sync, new_timer, setup)

    cold = warm_up(once, plan)
    samples: list[float] = []
    while len(samples) < plan.repeats_max and (
        len(samples) < plan.repeats_min or sum(samples) < plan.budget_s
    ):
        samples.append(once())
    median, low, iqr = summarize(samples)
    return TimingResult(
        scope=scope,
        median_s=median,
        min_s=low,
        iqr_s=iqr,
        n=len(samples),
        cold_s=cold,
        samples=samples,
        mode=mode,
    )


def measure_on(
    device: torch.device | str,
    fn: Callable[[], object],
    plan: TimingPlan = TimingPlan(),
    **kwargs,
) -> TimingResult:
    """``measure`` with the device's own synchronisation and timer (events on CUDA/MLU)."""
    return measure(
        fn, sync=lambda: synchronize(device), new_timer=lambda: timer(device), plan=plan, **kwargs
    )
