"""Honest timings: synchronise at the boundaries, warm up, keep the cold call apart, repeat.

Devices run asynchronously: a host clock read right after a launch measures the launch, not the
work. Every region here is bracketed by ``synchronize`` (CPU clock) or by device events, the
first (compile/allocation) call is recorded as ``cold_s`` and never mixed into the steady
state, warm-up runs until three consecutive samples agree within ``stable_rel`` (bounded by
``warmup_max``), and repetitions run until ``budget_s`` of measured time or ``repeats_max``,
never fewer than ``repeats_min``.

Updates are timed in one of two declared modes (docs/spec.md §5): ``reset`` restores the same state
before each repetition, outside the timed region; ``advance`` lets one request keep advancing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from convmatrix.core.devices import synchronize, timer
from convmatrix.core.records import TimingResult

__all__ = ["Sampling", "measure", "measure_on", "summarize", "time_once", "warm_up"]


@dataclass(frozen=True)
class Sampling:
    """How many calls a timing makes: warm-up bounds, the agreement that ends warm-up, and
    the repetitions (at least ``repeats_min``, more until ``budget_s`` or ``repeats_max``)."""

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


def warm_up(once: Callable[[], float], sampling: Sampling) -> float:
    """The cold call's time, after which calls repeat until three agree (bounded)."""
    cold = once()
    recent: list[float] = []
    for i in range(sampling.warmup_max):
        recent = [*recent[-2:], once()]
        if i + 1 >= sampling.warmup_min and len(recent) == 3:
            lo, hi = min(recent), max(recent)
            if hi - lo <= sampling.stable_rel * max(lo, 1e-12):
                break
    return cold


def measure(
    fn: Callable[[], object],
    *,
    sync: Callable[[], None],
    new_timer: Callable[[], object],
    sampling: Sampling = Sampling(),
    setup: Callable[[], None] | None = None,
    scope: str = "op",
    mode: str | None = None,
) -> TimingResult:
    """Time ``fn`` per ``sampling``; ``setup`` runs before each call, outside the timed region."""

    def once() -> float:
        return time_once(fn, sync, new_timer, setup)

    cold = warm_up(once, sampling)
    samples: list[float] = []
    while len(samples) < sampling.repeats_max and (
        len(samples) < sampling.repeats_min or sum(samples) < sampling.budget_s
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
    sampling: Sampling = Sampling(),
    **kwargs,
) -> TimingResult:
    """``measure`` with the device's own synchronisation and timer (events on CUDA/MLU)."""
    return measure(
        fn,
        sync=lambda: synchronize(device),
        new_timer=lambda: timer(device),
        sampling=sampling,
        **kwargs,
    )
