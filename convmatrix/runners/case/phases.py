"""Where a case's time goes: its phases, measured as it runs (wall time, seconds).

``inputs`` (tensors drawn and placed), ``kernel`` (the kernel's calls and their checks),
``framework`` (the torch path beside it), ``reference`` (the float64 oracle with the bound
magnitudes, or reading them from the reference cache), ``metrics`` (errors and bound usage),
``properties`` (guards and property checks), ``timing`` (a timed case's measurements) and
``harness`` (the rest: process bookkeeping, memory, sanitising). Summed over a run they say
whether it is device-bound: on a GPU the kernel takes milliseconds, and everything else is
time the host spends judging it.

``between`` is not part of a case's duration: it is the time its process spent since its
previous case ended (the executor's own work: the test protocol, sending the result, waiting
for the next case), so that a worker's wall time after its first case is the sum of its
cases' phases and nothing hides between them. A process's first case has none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PHASES", "Between", "Phases"]

PHASES = ("inputs", "kernel", "framework", "reference", "metrics", "properties", "timing",
          "harness", "between")  # fmt: skip


class Phases:
    """Seconds per phase; ``with phases("kernel"): ...`` adds the block's time to it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def close(self, total: float) -> dict[str, float]:
        """Every phase (harness: what ``total`` holds beyond the others), rounded to µs."""
        spent = sum(self.seconds.values())
        self.seconds["harness"] = max(0.0, total - spent)
        return {p: round(self.seconds[p], 6) for p in PHASES if p in self.seconds}


class Between:
    """The time a process spends between its cases (phase ``between``): ``start`` says how
    long since the last ``end`` (None before this process's first case)."""

    def __init__(self) -> None:
        self.last_end: float | None = None

    def start(self) -> float | None:
        return None if self.last_end is None else time.perf_counter() - self.last_end

    def end(self) -> None:
        self.last_end = time.perf_counter()
