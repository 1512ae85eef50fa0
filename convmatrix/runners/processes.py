"""Child processes a kernel starts, and a worker whose controller is gone.

A kernel may start processes (a compiler, a helper, ``sleep 600``) and never wait for them.
``CaseProcesses`` notes this process's descendants before a case and ends, after it, those
that appeared during it, so none outlives its case (or the run). ``watch_parent`` makes an
xdist worker end itself within a second when its controller dies (SIGKILL gives the
controller no chance to stop its workers), ending its kernel's children first.
Linux reads ``/proc``; elsewhere both do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["CaseProcesses", "descendants", "kill_new_descendants", "watch_parent"]

_PROC = Path("/proc")
PARENT_POLL_S = 0.25  # how often a worker looks for its controller
REAP_S = 1.0  # how long to wait for killed children to be reaped


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in _PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = entry.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    return children


def descendants(pid: int | None = None) -> set[int]:
    """Every process below ``pid`` (default: this one) in the process tree."""
    if not _PROC.is_dir():
        return set()
    children, found, todo = _children_map(), set(), [pid or os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_new_descendants(before: set[int]) -> list[int]:
    """SIGKILL the descendants of this process that are not in ``before``; their pids."""
    new = sorted(descendants() - before)
    for pid in new:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    pending, deadline = set(new), time.monotonic() + REAP_S
    while pending and time.monotonic() < deadline:  # reap our own children: no zombies
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (a grandchild): init reaps it
                done = pid
            except OSError:
                done = pid
            if done:
                pending.discard(pid)
        if pending:
            time.sleep(0.01)
    return new


class CaseProcesses:
    """``with CaseProcesses():`` around a case: processes it started end with it."""

    def __enter__(self) -> CaseProcesses:
        self.before = descendants()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ended = kill_new_descendants(self.before)


def watch_parent(poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """A daemon thread that ends this process (after its descendants) when its parent dies:
    the parent's pid changes once it is gone (re-parented to init or a subreaper)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_new_descendants(set())
        os._exit(75)  # EX_TEMPFAIL: the controller is gone, nothing is left to report to

    thread = threading.Thread(target=watch, name="convmatrix-parent-watch", daemon=True)
    thread.start()
    return thread
