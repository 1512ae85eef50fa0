"""Child processes a kernel starts, and a worker whose controller is gone.

A kernel may start processes (a compiler, a helper, ``sleep 600``) and never wait for them.
``CaseProcesses`` notes this process's descendants before a case and ends, after it, those
that appeared during it, so none outlives its case (or the run). A process that left the
tree (``setsid`` and a double fork: a daemon, re-parented to init) is found by the token the
case puts in the environment (``CONVMATRIX_CASE_TOKEN``), which every process it starts
inherits: ``/proc/*/environ`` is searched for it at the end of the case. ``watch_parent`` makes an
xdist worker end itself within a second when its controller dies (SIGKILL gives the
controller no chance to stop its workers), ending its kernel's children first.
Linux reads ``/proc``; elsewhere both do nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from pathlib import Path

__all__ = [
    "TOKEN_ENV",
    "CaseProcesses",
    "descendants",
    "kill_new_descendants",
    "marked",
    "watch_parent",
]

TOKEN_ENV = "CONVMATRIX_CASE_TOKEN"

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


def marked(token: str) -> set[int]:
    """Every process (but this one) whose environment, as it was started, holds ``token``
    in ``CONVMATRIX_CASE_TOKEN``: the processes a case started, wherever they went."""
    needle = f"{TOKEN_ENV}={token}\0".encode()
    found = set()
    for entry in _PROC.glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if needle in entry.read_bytes():
                found.add(int(entry.parent.name))
    found.discard(os.getpid())
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def kill_new_descendants(before: set[int], token: str | None = None) -> list[int]:
    """SIGKILL the descendants of this process that are not in ``before`` and, with
    ``token``, every process carrying it (``marked``); their pids."""
    new = sorted(descendants() - before)
    if token is not None:
        new += sorted(marked(token) - set(new) - before)
    _kill(new)
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
    """``with CaseProcesses():`` around a case: processes it started end with it, in the
    tree or not (the case's environment token)."""

    def __enter__(self) -> CaseProcesses:
        self.before = descendants()
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._saved = os.environ.get(TOKEN_ENV)
        os.environ[TOKEN_ENV] = self.token
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = self._saved
        self.ended = kill_new_descendants(self.before, self.token if _PROC.is_dir() else None)


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
