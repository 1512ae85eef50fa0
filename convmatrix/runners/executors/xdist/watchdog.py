"""The per-case time limit: a hung kernel becomes a ``timeout`` result and the run goes on.

A kernel stuck in device code cannot be interrupted from Python, so the watchdog does not try:
when the limit passes it sends the ``timeout`` result through the same report channel a normal
result takes (to the xdist controller, or to the in-process recorder), then ends the process
with ``os._exit``. xdist sees a dead worker, starts a replacement and reports the in-flight
case as crashed; the recorder ignores that second report because the case already holds its
``timeout``. A lock makes "the case finished" and "the watchdog fired" mutually exclusive, so
a case is recorded exactly once.

A kernel that holds the GIL never lets the watchdog thread run; ``faulthandler`` (a C-level
timer) then ends the process some seconds later and the case is recorded as crashed. In a
single process (``-n 0``) nothing is left to record it: a ``Witness`` (a tiny process started
before the run, fed the case each time one starts) prints one line when the run's process
ends without saying it is done: the case, the run to ``--resume`` and the file holding
faulthandler's traceback. A ``-n 0`` run whose case times out (the soft limit) exits 1: the
run stopped early.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from traceback import format_exc
from types import TracebackType
from typing import IO

__all__ = [
    "EXIT_STATUS",
    "SINGLE_EXIT_STATUS",
    "Watchdog",
    "Witness",
    "quiet",
    "witness",
    "witnessed",
]

HARD_GRACE_S = 15.0  # after the soft limit, faulthandler's hard exit
HARD_SLACK_S = 5.0  # ... which may come up to this much later (the timer is kept across cases)
IDLE_MARGIN_S = 5.0  # outside a case, the timer is cancelled this long before it would fire
EXIT_STATUS = 70  # what a worker exits with after a timeout (EX_SOFTWARE): xdist replaces it
SINGLE_EXIT_STATUS = 1  # a -n 0 run stopped at a hung case: the run stopped early

# The witness: reads what the run says on stdin (its run id, then "done"); at its end (the
# run's process is gone) one line, unless the run said "done", naming the case the case file
# holds. Ignores SIGINT (a Ctrl-C is the run's to report).
_WITNESS = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
trace, current, run, done = sys.argv[1], sys.argv[2], None, False
for line in sys.stdin:
    kind, _, rest = line.rstrip("\n").partition(" ")
    if kind == "run":
        run = rest
    elif kind == "done":
        done = True
try:
    with open(current, encoding="utf-8", errors="replace") as f:
        case = f.read().strip() or None
    os.unlink(current)
except OSError:
    case = None
try:
    size = os.path.getsize(trace)
except OSError:
    size = 0
if not done:
    where = f"during case {case}" if case else "outside any case"
    if size:
        how = ("faulthandler ended it (a hang holding the GIL past the case's limit, or a "
               f"fatal signal): its traceback is in {trace}")
    else:
        how = "without a result (killed, or a kernel called os._exit)"
    again = f"; convmatrix run --resume {run} runs the rest" if run else ""
    sys.stderr.write(f"convmatrix: the run's process ended {where}: {how}{again}\n")
    sys.stderr.flush()
if not size:
    try:
        os.unlink(trace)
    except OSError:
        pass
"""


class Witness:
    """A process that outlives a single-process run and speaks for it if it dies (see the
    module's docstring). ``case(name)`` before a case, ``idle()`` after, ``done()`` at the
    end; ``trace`` is the file faulthandler writes to.

    The case in progress is written over the start of a small file (``current``) that the
    witness reads once the run's process is gone, not sent down its pipe: a line down the
    pipe, twice a case, woke the witness process each time, and on a loaded host the wake-up
    (a switch to it, then back) cost 0.25 ms a line in a profiled run."""

    def __init__(self, directory: Path | None = None) -> None:
        where = Path(directory or tempfile.gettempdir())
        self.path = where / f"convmatrix-fatal-{os.getpid()}.txt"
        self.current = where / f"convmatrix-case-{os.getpid()}.txt"
        self.trace: IO[str] = self.path.open("w", encoding="utf-8")
        self._case_fd = os.open(self.current, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._width = 0  # what the file holds: each write covers the one before it
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WITNESS, str(self.path), str(self.current)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
            )  # fmt: skip
        except OSError:  # no witness (the run goes on unwitnessed): none of its files left
            os.close(self._case_fd)
            self.trace.close()
            for path in (self.current, self.path):
                path.unlink(missing_ok=True)
            raise
        faulthandler.enable(file=self.trace)  # a segfault's traceback goes there too

    def _note(self, text: str) -> None:
        """``text`` as the file's content (blank padding after it: one write, no truncate)."""
        data = text.encode("utf-8", "backslashreplace")
        self._width = max(self._width, len(data))
        if self._case_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.pwrite(self._case_fd, data.ljust(self._width), 0)

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def run(self, run_id: int | None) -> None:
        if run_id is not None:
            self._say(f"run {run_id}")

    def case(self, name: str) -> None:
        self._note(name)

    def idle(self) -> None:
        self._note("")

    def done(self) -> None:
        """The run ended in order: the witness leaves without a word."""
        self._say("done")
        fd, self._case_fd = self._case_fd, -1  # done() may come twice (a timeout, then the end)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


_witness: list[Witness] = []  # the single-process run's witness, while it runs


@contextlib.contextmanager
def witnessed(enabled: bool = True):
    """``with witnessed():`` around a single-process run (the xdist executor's ``-n 0``)."""
    if not enabled:
        yield None
        return
    try:
        found = Witness()
    except OSError:  # no temporary directory or no process to spare: run unwitnessed
        yield None
        return
    _witness.append(found)
    try:
        yield found
    finally:
        _witness.remove(found)
        found.done()


def witness() -> Witness | None:
    """The witness of the run going on in this process, if any."""
    return _witness[-1] if _witness else None


class _Alarm:
    """One daemon thread per process that calls the armed watchdogs' ``fire`` when their
    deadline passes. A ``threading.Timer`` a case started a thread a case, and starting one
    waits for the scheduler: on a loaded host that was a good part of the harness's cost."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Callable[[], None]]] = {}
        self._owner = 0  # the pid whose thread runs (a forked child starts its own)
        self._until = math.inf  # when the thread wakes next: a later deadline needs no wake-up

    def arm(self, key: int, timeout_s: float, fire: Callable[[], None]) -> None:
        with self._cond:
            deadline = time.monotonic() + timeout_s
            self._armed[key] = (deadline, fire)
            if self._owner != os.getpid():
                self._owner, self._until = os.getpid(), math.inf
                thread = threading.Thread(target=self._loop, name="convmatrix-watchdog")
                thread.daemon = True
                thread.start()
            if deadline < self._until:
                self._cond.notify()

    def disarm(self, key: int) -> None:
        with self._cond:
            self._armed.pop(key, None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [k for k, (deadline, _) in self._armed.items() if deadline <= now]
                fire = [self._armed.pop(k)[1] for k in due]
                if not fire:
                    self._until = min((d for d, _ in self._armed.values()), default=math.inf)
                    self._cond.wait(None if self._until == math.inf else self._until - now)
                    continue
            for call in fire:
                call()


_ALARM = _Alarm()


class _HardLimit:
    """faulthandler's hard exit (``dump_traceback_later``), kept armed across cases.

    Each ``dump_traceback_later`` starts a C thread and each cancel joins it: a thread started
    and joined a case, which on a loaded host waits for the scheduler (0.66 ms a case in a
    profiled ``nightly -n 0`` at load 3). So a case whose limit the armed timer already
    satisfies (it fires between ``HARD_GRACE_S`` and ``HARD_GRACE_S + HARD_SLACK_S`` after the
    case's limit) leaves it as it is: it is re-armed at most every ``HARD_SLACK_S`` seconds.
    Outside a case the timer must never fire (an xdist worker waits for its next case, the
    pipeline goes on after the session): the alarm thread cancels it ``IDLE_MARGIN_S`` before
    its deadline when no case is running, and ``quiet()`` at the end of the session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadline: float | None = None  # when the armed timer fires (monotonic)
        self._armed_for: tuple[int, int] | None = None  # (pid, id of its file)
        self._active = 0  # cases running under it

    def enter(self, timeout_s: float, file: IO[str] | None) -> None:
        """A case with limit ``timeout_s`` (0: none) starts."""
        with self._lock:
            self._active += 1
            now = time.monotonic()
            if timeout_s <= 0:  # no limit: no hard exit either
                self._cancel()
                return
            earliest = now + timeout_s + HARD_GRACE_S
            armed_for = (os.getpid(), id(file))
            deadline = self._deadline
            if (
                deadline is not None
                and self._armed_for == armed_for
                and earliest <= deadline <= earliest + HARD_SLACK_S
            ):
                return
            where = {"file": file} if file is not None else {}
            after = timeout_s + HARD_GRACE_S + HARD_SLACK_S
            faulthandler.dump_traceback_later(after, exit=True, **where)
            self._deadline, self._armed_for = earliest + HARD_SLACK_S, armed_for

    def leave(self) -> None:
        """The case ended: the timer stays, watched by the alarm thread while no case runs."""
        with self._lock:
            self._active -= 1
            deadline = self._deadline
        if deadline is not None:
            _ALARM.arm(id(self), deadline - IDLE_MARGIN_S - time.monotonic(), self._idle)

    def _idle(self) -> None:
        with self._lock:
            if self._active == 0:
                self._cancel()

    def quiet(self) -> None:
        """No more cases: no hard exit pending."""
        with self._lock:
            self._cancel()

    def _cancel(self) -> None:
        armed_for = self._armed_for
        if armed_for is not None and armed_for[0] == os.getpid():  # a forked child: no timer
            faulthandler.cancel_dump_traceback_later()
        self._deadline = self._armed_for = None


_HARD = _HardLimit()


def quiet() -> None:
    """Cancel the hard exit kept armed after the last case (``_HardLimit``): the session is
    over, no case runs in this process any more."""
    _HARD.quiet()


class Watchdog:
    """Context manager around one case: ``on_timeout`` runs in a thread if the body overruns.

    ``on_timeout`` must deliver the timeout result; the process exits right after it. Use
    ``finished()`` at the end of the body (or leave the ``with``): from then on the watchdog
    cannot fire, and if it is already firing, the caller blocks until the process ends.
    """

    def __init__(
        self, timeout_s: float, on_timeout: Callable[[], None], exit_status: int = EXIT_STATUS
    ) -> None:
        self.timeout_s = timeout_s
        self.exit_status = exit_status
        self._on_timeout = on_timeout
        self._lock = threading.Lock()
        self._done = False

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0:
            _ALARM.arm(id(self), self.timeout_s, self._fire)
        seen = witness()  # sys.stderr is pytest's capture here: lost with the process
        _HARD.enter(self.timeout_s, seen.trace if seen is not None else None)
        self._entered = True
        return self

    def finished(self) -> None:
        with self._lock:  # blocks forever if the watchdog fired: the process is ending
            self._done = True
        _ALARM.disarm(id(self))
        if getattr(self, "_entered", False):
            self._entered = False
            _HARD.leave()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finished()

    def _fire(self) -> None:
        self._lock.acquire()  # never released: the case's own result must not follow
        if self._done:
            self._lock.release()
            return
        try:
            self._on_timeout()
        except BaseException:  # still leave: the case is hung either way
            # sys.stderr may be pytest's capture buffer: write to the real descriptor.
            os.write(2, f"convmatrix: recording the timeout failed:\n{format_exc()}".encode())
        finally:
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(self.exit_status)
