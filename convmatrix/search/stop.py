"""Stopping a search in time: a person's SIGINT or SIGTERM, or the end of its budget.

A search runs for minutes or hours and is worth what it found so far, so a signal must end
it within seconds *with* its findings written (exit 130), and its budget must bound it even
while a case of a round hangs. Both arrive as a ``KeyboardInterrupt`` raised in the main
thread, the one exception every layer below lets through: pytest ends its session on it
(xdist stops its workers) and the run is recorded ``interrupted``; a case running in this
process (``-n 0``) is left, not recorded as crashed, because the signal was noted first
(``runners.case.interrupts.note_signal``). ``Stopping`` remembers which of the two it was, so the
search can tell "stop and write" (a signal) from "the budget is spent" (go on to the end as
after any last round).

With ``forward`` (the xdist executor) either one is passed on to this process's children as
SIGINT: xdist stops its workers on an interrupt only by asking them to exit after their case,
and waits 10 s before it kills one, so a worker in a long (or hung) case would hold the stop
for that long; its own SIGINT handler ends the case at once instead.

Trap: an exception raised by a signal handler is lost when the handler happens to run inside a
garbage collector's callback or a ``__del__`` (Python prints "Exception ignored" and goes on).
So a stop insists: until the search says it took it (``settle``), or a pytest session caught
it (``runners.case.interrupts.note_taken``: raised again there, it would cut short the close of
the round's run and leave it ``running``), it is raised again every ``INSIST_S`` seconds
(``_thread.interrupt_main``: simulated, never a real signal, so nothing happens once the
handler is gone).

Trap: pytest's own SIGTERM handler (``runners.executors.xdist.plugin``) is installed only where
none is, and stays installed after the session; without these handlers a SIGTERM during a round
ended that round only, and the search went on to its budget.
"""

from __future__ import annotations

import _thread
import contextlib
import glob
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from convmatrix.runners.case.interrupts import interrupt_taken, note_signal

__all__ = ["BudgetSpent", "Stopping", "stoppable"]

_STOPS = (signal.SIGINT, signal.SIGTERM)
INSIST_S = 2.0  # a stop not taken yet is raised again this often


class BudgetSpent(KeyboardInterrupt):
    """The search's budget ran out inside a round (``Stopping.alarm``): the round is cut."""


@dataclass
class Stopping:
    """What stopped the search early, if anything: the first signal received (``signum``),
    or the budget's alarm (``budget_spent``)."""

    signum: int | None = None
    budget_spent: bool = False
    forward: bool = False  # pass the stop on to this process's children (xdist workers)
    _unsettled: set[int] = field(default_factory=set, repr=False)  # stops not taken yet
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def settle(self, signum: int | None = None) -> None:
        """The search took the stop (``signum``'s; None: every one): no more insisting."""
        with self._lock:
            if signum is None:
                self._unsettled.clear()
            else:
                self._unsettled.discard(signum)

    def _signalled(self, signum: int, frame: Any) -> None:
        # No lock here: the handler runs in the main thread, which may hold it (settle).
        note_signal(signum)
        if self.signum is None:
            self.signum = signum
            self._insist(signum)
        self._pass_on()
        raise KeyboardInterrupt(f"signal {signum}")

    def _spent(self, signum: int, frame: Any) -> None:
        note_signal(signum)  # a case in this process leaves, it is not "crashed"
        if not self.budget_spent:
            self.budget_spent = True
            self._insist(signum)
        self._pass_on()
        raise BudgetSpent("the search's budget ran out")

    def _insist(self, signum: int) -> None:
        """Raise ``signum``'s stop again every ``INSIST_S`` until it is settled."""
        self._unsettled.add(signum)

        def again() -> None:
            while True:
                time.sleep(INSIST_S)
                with self._lock:
                    if signum not in self._unsettled or interrupt_taken():
                        return
                    _thread.interrupt_main(signum)

        threading.Thread(target=again, name="convmatrix-stop", daemon=True).start()

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
            self.settle(signal.SIGALRM)
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
        stopping.settle()
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
