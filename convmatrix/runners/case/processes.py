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
import functools
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
_LAST_PID = "/proc/sys/kernel/ns_last_pid"
_PROBE_MAX = 4096  # more pids given during a case than this: list /proc instead of probing
PARENT_POLL_S = 0.25  # how often a worker looks for its controller
REAP_S = 1.0  # how long to wait for killed children to be reaped


def _read(path: str, size: int = 4096) -> bytes | None:
    """The first ``size`` bytes of a ``/proc`` file with one open and one read (``Path``'s
    machinery is most of the cost of a scan); None when it is gone or not ours to read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _ppid(pid: int) -> int | None:
    """The parent of ``pid`` (``/proc/PID/stat``, after the command name), or None."""
    data = _read(f"/proc/{pid}/stat", 512)
    if not data:
        return None
    at = data.rfind(b")") + 4  # ") S PPID ..."
    try:
        return int(data[at : data.index(b" ", at)])
    except ValueError:
        return None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir(_PROC) if name.isdigit()]


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        parent = _ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
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


def _carries(pid: int, needle: bytes) -> bool:
    """Whether the environment ``pid`` was started with holds ``needle`` (read in chunks)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except OSError:
        return False
    try:
        tail = b""
        while chunk := os.read(fd, 1 << 16):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    except OSError:
        pass
    finally:
        os.close(fd)
    return False


def _needle(token: str) -> bytes:
    return f"{TOKEN_ENV}={token}\0".encode()


def marked(token: str) -> set[int]:
    """Every process (but this one) whose environment, as it was started, holds ``token``
    in ``CONVMATRIX_CASE_TOKEN``: the processes a case started, wherever they went."""
    needle = _needle(token)
    found = {pid for pid in _pids() if _carries(pid, needle)}
    found.discard(os.getpid())
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _end(pids: list[int]) -> list[int]:
    """SIGKILL ``pids`` and reap those that are our children (no zombies); ``pids``."""
    _kill(pids)
    pending, deadline = set(pids), time.monotonic() + REAP_S
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
    return pids


def kill_new_descendants(before: set[int], token: str | None = None) -> list[int]:
    """SIGKILL the descendants of this process that are not in ``before`` and, with
    ``token``, every process carrying it (``marked``); their pids."""
    new = sorted(descendants() - before)
    if token is not None:
        new += sorted(marked(token) - set(new) - before)
    return _end(new)


@functools.cache
def _same_namespace(pid: int) -> bool:
    """Whether ``/proc`` numbers processes as this process's pid namespace does (the counter
    counts there; a ``/proc`` of another namespace would not show its pids)."""
    try:
        return os.readlink("/proc/self") == str(pid)
    except OSError:
        return False


def _last_pid() -> int | None:
    """The pid the kernel gave last (in this pid namespace), or None where it cannot say."""
    if not _same_namespace(os.getpid()):
        return None
    data = _read(_LAST_PID, 64)
    try:
        return int(data) if data else None
    except ValueError:
        return None


def _started_since(mark: int, now: int) -> list[int]:
    """Every live pid given after ``mark`` up to ``now`` (pids count up and wrap to the
    bottom at ``pid_max``): probed one by one when they are few, else filtered from a
    listing. Thread ids come from the same counter and are among them."""
    if mark <= now < mark + _PROBE_MAX:
        return [pid for pid in range(mark + 1, now + 1) if os.path.exists(f"/proc/{pid}")]
    if now >= mark:
        return [pid for pid in _pids() if mark < pid <= now]
    return [pid for pid in _pids() if pid > mark or pid <= now]  # wrapped


def _leader(pid: int) -> bool:
    """Whether ``pid`` is a process, not one of its threads (``Tgid`` is itself)."""
    data = _read(f"/proc/{pid}/status", 1024) or b""
    at = data.find(b"\nTgid:")
    return at >= 0 and int(data[at + 6 : data.index(b"\n", at + 1)]) == pid


def started_by_case(mark: int, now: int, token: str | None) -> list[int]:
    """The processes started after pid ``mark`` (up to ``now``) that are below this process
    in the tree, or (``token``) carry the case's token wherever they went: what a case
    started. Only the pids given since the mark are read, not every process of the host."""
    me, below = os.getpid(), {}
    parents: dict[int, int | None] = {}

    def ours(pid: int) -> bool:
        chain = []
        while pid not in below and pid > 1 and pid != me:
            chain.append(pid)
            if pid not in parents:
                parents[pid] = _ppid(pid)
            pid = parents[pid] or 0
        answer = below.get(pid, pid == me)
        below.update(dict.fromkeys(chain, answer))
        return answer

    needle = _needle(token) if token is not None else None
    found = [
        pid
        for pid in _started_since(mark, now)
        if not os.path.exists(f"/proc/self/task/{pid}")  # this process or its threads
        and (ours(pid) or (needle is not None and _carries(pid, needle)))
    ]
    return sorted(pid for pid in found if _leader(pid))


class CaseProcesses:
    """``with CaseProcesses():`` around a case: processes it started end with it, in the
    tree or not (the case's environment token).

    What a case started is told by the pid counter (``/proc/sys/kernel/ns_last_pid``): pids
    are given in order, so the processes started during the case are those given after the
    mark taken before it. A case that started nothing, on a host that started nothing else
    meanwhile, costs two small reads; otherwise only the pids given meanwhile are read (the
    scan of every process, twice a case, was 42% of ``run_case``). Where the counter cannot
    be read, every process is scanned before and after, as before."""

    def __enter__(self) -> CaseProcesses:
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._saved = os.environ.get(TOKEN_ENV)
        os.environ[TOKEN_ENV] = self.token
        self.mark = _last_pid()
        self.before = descendants() if self.mark is None else set()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = self._saved
        token = self.token if _PROC.is_dir() else None
        now = _last_pid() if self.mark is not None else None
        if self.mark is None or now is None:
            self.ended = kill_new_descendants(self.before, token)
        elif now == self.mark:  # no pid given anywhere since the mark: nothing started
            self.ended = []
        else:
            self.ended = _end(started_by_case(self.mark, now, token))


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
