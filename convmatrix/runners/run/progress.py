"""Progress of a long run: cases done of the total, failures so far, rate, ETA, per device.

The recorder of a run (the xdist controller, the Ray driver) feeds every recorded result to one
``Progress``; it prints a line on stderr at most every ``interval_s`` seconds. On a terminal
that is every 10 s; under CI (``CI=true``) or when stderr is not a terminal, pytest's dots and
per-line output are useless in a log, so the default is one line a minute: quiet, but a
stalled nightly still shows where it stands. ``CONVMATRIX_PROGRESS_S`` sets the interval
(``0`` turns the lines off).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

from convmatrix.core.records import BAD_OUTCOMES, CaseResult

__all__ = ["ENV", "Progress", "default_interval", "device_of"]

ENV = "CONVMATRIX_PROGRESS_S"
TTY_INTERVAL_S = 10.0
CI_INTERVAL_S = 60.0


def default_interval(stream: TextIO | None = None, environ: dict | None = None) -> float:
    """Seconds between lines: ``CONVMATRIX_PROGRESS_S``, else 60 under CI or off a terminal,
    else 10."""
    env = os.environ if environ is None else environ
    if env.get(ENV):
        try:
            return max(0.0, float(env[ENV]))
        except ValueError:
            from convmatrix.core.errors import UsageError

            raise UsageError(f"{ENV}={env[ENV]!r}: give seconds between progress lines") from None
    stream = sys.stderr if stream is None else stream
    quiet = env.get("CI", "").lower() in ("1", "true", "yes") or not stream.isatty()
    return CI_INTERVAL_S if quiet else TTY_INTERVAL_S


def device_of(result: CaseResult) -> str:
    """Where a result ran, for the per-device counts: host:index, else the worker."""
    if result.host is not None and result.device_index is not None:
        return f"{result.host}:{result.device_index}"
    return result.worker or result.host or "local"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts recorded results and prints a line when ``interval_s`` has passed since the
    last one (checked on each result, so nothing runs between results)."""

    def __init__(
        self,
        total: int,
        interval_s: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.interval_s = default_interval(self.stream) if interval_s is None else interval_s
        self.clock = clock
        self.started = clock()
        self.last = self.started
        self.done = 0
        self.bad = 0
        self.retries = 0
        self.devices: Counter[str] = Counter()

    def update(self, result: CaseResult) -> None:
        self.done += 1
        self.bad += result.outcome in BAD_OUTCOMES
        self.retries += result.retries
        self.devices[device_of(result)] += 1
        now = self.clock()
        if self.interval_s > 0 and now - self.last >= self.interval_s:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        """``progress: 40/122 (33%), 2 failing, 3.1 cases/s, ETA 26 s; host:0 20, host:1 20``."""
        elapsed = max(1e-9, (self.clock() if now is None else now) - self.started)
        rate = self.done / elapsed
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        left = max(0, self.total - self.done)
        eta = _duration(left / rate) if rate > 0 else "unknown"
        text = f"progress: {self.done}/{self.total}{share}, {self.bad} failing, "
        text += f"{rate:.2f} cases/s, ETA {eta}"
        if self.retries:
            text += f", {self.retries} retries"
        if self.devices:
            text += "; " + ", ".join(f"{d} {n}" for d, n in sorted(self.devices.items()))
        return text
