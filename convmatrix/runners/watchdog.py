"""The per-case time limit: a hung kernel becomes a ``timeout`` result and the run goes on.

A kernel stuck in device code cannot be interrupted from Python, so the watchdog does not try:
when the limit passes it sends the ``timeout`` result through the same report channel a normal
result takes (to the xdist controller, or to the in-process recorder), then ends the process
with ``os._exit``. xdist sees a dead worker, starts a replacement and reports the in-flight
case as crashed; the recorder ignores that second report because the case already holds its
``timeout``. A lock makes "the case finished" and "the watchdog fired" mutually exclusive, so
a case is recorded exactly once.

A kernel that holds the GIL never lets the watchdog thread run; ``faulthandler`` (a C-level
timer) then ends the process some seconds later and the case is recorded as crashed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from collections.abc import Callable
from traceback import format_exc
from types import TracebackType

__all__ = ["Watchdog"]

HARD_GRACE_S = 15.0  # after the soft limit, faulthandler's hard exit
EXIT_STATUS = 70  # what the process exits with after a timeout (EX_SOFTWARE)


class Watchdog:
    """Context manager around one case: ``on_timeout`` runs in a thread if the body overruns.

    ``on_timeout`` must deliver the timeout result; the process exits right after it. Use
    ``finished()`` at the end of the body (or leave the ``with``): from then on the watchdog
    cannot fire, and if it is already firing, the caller blocks until the process ends.
    """

    def __init__(self, timeout_s: float, on_timeout: Callable[[], None]) -> None:
        self.timeout_s = timeout_s
        self._on_timeout = on_timeout
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0:
            self._timer.start()
            faulthandler.dump_traceback_later(self.timeout_s + HARD_GRACE_S, exit=True)
        return self

    def finished(self) -> None:
        with self._lock:  # blocks forever if the watchdog fired: the process is ending
            self._done = True
        self._timer.cancel()
        if self.timeout_s > 0:
            faulthandler.cancel_dump_traceback_later()

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
            os._exit(EXIT_STATUS)
