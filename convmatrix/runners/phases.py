"""Where a case's time goes: its phases, measured as it runs (wall time, seconds).

``inputs`` (tensors drawn and placed), ``kernel`` (the kernel's calls and their checks),
``framework`` (the torch path beside it), ``reference`` (the float64 oracle with the bound
magnitudes, or reading them from the reference cache), ``metrics`` (errors and bound usage),
``properties`` (guards and property checks), ``timing`` (a timed case's measurements) and
``harness`` (the rest: process bookkeeping, memory, sanitising). Summed over a run they say
whether it is device-bound: on a GPU the kernel takes milliseconds, and everything else is
time the host spends judging it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PHASES", "Phases"]

PHASES = ("inputs", "kernel", "framework", "reference", "metrics", "properties", "timing",
          "harness")  # fmt: skip


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
