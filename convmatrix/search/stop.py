"""Stopping a search in time: a person's SIGINT or SIGTERM, or the end of its budget.

A search runs for minutes or hours and is worth what it found so far, so a signal must end
it within seconds *with* its findings written (exit 130), and its budget must bound it even
while a case of a round hangs. Both arrive as a ``KeyboardInterrupt`` raised in the main
thread, the one exception every layer below lets through: pytest ends its session on it
(xdist stops its workers) and the run is recorded ``interrupted``; a case running in this
process (``-n 0``) is left, not recorded as crashed, because the signal was noted first
(``runners.interrupts.note_signal``). ``Stopping`` remembers which of the two it was, so the
search can tell "stop and write" (a signal) from "the budget is spent" (go on to the end as
after any last round).

With ``forward`` (the xdist engine) either one is passed on to this process's children as
SIGINT: xdist stops its workers on an interrupt only by asking them to exit after their case,
and waits 10 s before it kills one, so a worker in a long (or hung) case would hold the stop
for that long; its own SIGINT handler ends the case at once instead.

Trap: pytest's own SIGTERM handler (``runners.plugin``) is installed only where none is, and
stays installed after the session; without these handlers a SIGTERM during a round ended
that round only, and the search went on to its budget.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from convmatrix.runners.interrupts import note_signal

__all__ = ["BudgetSpent", "Stopping", "stoppable"]

_STOPS = (signal.SIGINT, signal.SIGTERM)


class BudgetSpent(KeyboardInterrupt):
    """The search's budget ran out inside a round (``Stopping.alarm``): the round is cut."""


@dataclass
class Stopping:
    """What stopped the search early, if anything: the first signal received (``signum``),
    or the budget's alarm (``budget_spent``)."""

    signum: int | None = None
    budget_spent: bool = False
    forward: bool = False  # pass the stop on to this process's children (xdist workers)

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def _signalled(self, signum: int, frame: Any) -> None:
        note_signal(signum)
        if self.signum is None:
            self.signum = signum
        self._pass_on()
        raise KeyboardInterrupt(f"signal {signum}")

    def _spent(self, signum: int, frame: Any) -> None:
        note_signal(signum)  # a case in this process leaves, it is not "crashed"
        self.budget_spent = True
        self._pass_on()
        raise BudgetSpent("the search's budget ran out")

    def _pass_on(self) -> None:
        if not self.forward:
            return
        for pid in _children():
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGINT)

    @contextlib.contextmanager
    def alarm(self, seconds: float) -> Iterator[None]:
        """``BudgetSpent`` in the main thread after ``seconds`` unless the block ended first
        (SIGALRM: it interrupts a wait in C as a signal does). Outside the main thread, or
        where SIGALRM does not exist, nothing is armed."""
        try:
            previous = signal.signal(signal.SIGALRM, self._spent)
        except (ValueError, AttributeError):  # not the main thread; no SIGALRM here
            yield
            return
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _children() -> set[int]:
    """This process's own children (not theirs: a kernel's helpers are its case's to end).
    Linux lists them per thread in ``/proc``; elsewhere none are found."""
    found: set[int] = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            found.update(int(pid) for pid in f.read().split())
    return found


@contextlib.contextmanager
def stoppable() -> Iterator[Stopping]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread while the block runs,
    noted in the ``Stopping`` yielded; the handlers before it come back after. Outside the main
    thread no handler can be installed: the block runs as it would have."""
    stopping = Stopping()
    saved: dict[int, Any] = {}
    try:
        for signum in _STOPS:
            saved[signum] = signal.signal(signum, stopping._signalled)
    except ValueError:  # not the main thread
        pass
    try:
        yield stopping
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
