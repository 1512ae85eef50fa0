"""A case's printed output, bounded before pytest, xdist or Ray see it.

pytest captures what a test prints and ships all of it, per report, from an xdist worker to
the controller: 100 MB of coloured stdout from one passing case took the controller from 0.7
to 2.8 GB. ``CappedOutput`` sits inside pytest's capture for one case: file descriptors 1 and
2 (what C code and child processes write) and ``sys.stdout``/``sys.stderr`` (what Python
prints) go to pipes whose readers keep the first and the last ``KEEP`` bytes of each stream
and count the rest; after the case the kept text is printed where it would have gone (pytest's
capture), with one line saying how much was cut. Memory stays bounded however much a kernel
prints; nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import select
import struct
import sys
import threading
from types import TracebackType
from typing import TextIO

try:  # FIONREAD: how many bytes a pipe holds (POSIX); elsewhere every case takes the marker
    from fcntl import ioctl
    from termios import FIONREAD
except ImportError:  # pragma: no cover - not POSIX
    ioctl, FIONREAD = None, 0

__all__ = ["KEEP", "CappedOutput", "Tail"]

KEEP = 16 << 10  # bytes kept at each end of each stream
JOIN_S = 2.0  # how long to wait for a stream's last bytes to be read


class Tail:
    """What one case wrote to one stream: the first and the last ``keep`` bytes, and the
    count of everything."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def text(self) -> str:
        """What was kept, with the cut marked."""
        cut = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if cut <= 0:
            return head + tail
        return (
            f"{head}\n[... convmatrix: {cut:,} of {self.total:,} bytes of the kernel's output "
            f"cut here (kept the first {len(self.head):,} and the last {len(self.tail):,}) ...]\n"
            f"{tail}"
        )


class _Pipe:
    """One stream's pipe and its reader thread, kept for the life of the process: a pipe and
    a thread a case, started and joined, cost about a millisecond a case, more on a loaded
    host. The reader feeds the case's ``Tail``; the end of a case is a random marker written
    after the stream is restored, so what the case wrote is all read before its text is
    taken (a child still holding the pipe later writes into nobody's case).

    Most cases print nothing; for them the marker's round trip (a write that wakes the reader,
    a wait for it to be scheduled) was most of the output's cost, more on a loaded host. So
    the reader marks itself ``busy`` before it reads; a case whose pipe is empty
    (``FIONREAD``) while the reader holds nothing has had everything it wrote added to its
    ``Tail`` already, and its text is taken without a marker."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()
        self.cond = threading.Condition()
        self.tail = Tail()
        self.marker: bytes | None = None
        self.busy = False  # the reader may hold bytes not yet added to the case's Tail
        thread = threading.Thread(target=self._loop, name="convmatrix-output", daemon=True)
        thread.start()

    def _loop(self) -> None:
        pending = b""
        poller = select.poll()
        poller.register(self.read, select.POLLIN)
        with contextlib.suppress(OSError):
            while True:
                poller.poll()  # bytes (or the end) are there: read them as busy
                with self.cond:
                    self.busy = True
                chunk = os.read(self.read, 1 << 16)
                if not chunk:
                    return
                with self.cond:
                    self.busy = False
                    data, marker = pending + chunk, self.marker
                    at = data.find(marker) if marker else -1
                    if marker and at >= 0:
                        self.tail.add(data[:at])
                        pending, self.marker, self.tail = b"", None, Tail()
                        self.cond.notify_all()
                        continue
                    keep = len(marker) - 1 if marker else 0  # a marker split over two reads
                    self.tail.add(data[: len(data) - keep])
                    pending = data[len(data) - keep :]

    def begin(self) -> None:
        with self.cond:
            self.tail = Tail()

    def _unread(self) -> int:
        """Bytes in the pipe not read yet (-1: cannot tell)."""
        if ioctl is None:
            return -1
        try:
            got = ioctl(self.read, FIONREAD, b"\0\0\0\0")
        except OSError:
            return -1
        return struct.unpack("i", got)[0]

    def end(self) -> str:
        """The case's text, once everything written before this call has been read."""
        with self.cond:
            if self.marker is None and not self.busy and self._unread() == 0:
                tail, self.tail = self.tail, Tail()  # all read and kept: nothing in flight
                return tail.text()
        marker = f"\0convmatrix-end-{secrets.token_hex(8)}\0".encode()
        with self.cond:
            tail, self.marker = self.tail, marker
        os.write(self.write, marker)
        with self.cond:
            self.cond.wait_for(lambda: self.marker is None, JOIN_S)
        return tail.text()


_pipes: dict[tuple[int, int], _Pipe] = {}  # (pid, fd) -> its pipe: a forked child makes its own


def _pipe(fd: int) -> _Pipe:
    key = (os.getpid(), fd)
    if key not in _pipes:
        _pipes[key] = _Pipe()
    return _pipes[key]


class _Stream:
    """One redirected stream: its descriptor and Python object, and where they pointed."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self.pipe = _pipe(fd)
        self.pipe.begin()
        self.saved_fd = os.dup(fd)
        self.saved_obj: TextIO = getattr(sys, name)
        with contextlib.suppress(Exception):
            self.saved_obj.flush()
        os.dup2(self.pipe.write, fd)
        wrapper = io.TextIOWrapper(
            open(self.pipe.write, "wb", buffering=0, closefd=False),  # noqa: SIM115 - closed in close()
            encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True,
        )  # fmt: skip
        self.obj = wrapper
        setattr(sys, name, wrapper)

    def close(self) -> str:
        with contextlib.suppress(Exception):
            self.obj.flush()
        if getattr(sys, self.name) is self.obj:
            setattr(sys, self.name, self.saved_obj)
        os.dup2(self.saved_fd, self.fd)
        os.close(self.saved_fd)
        with contextlib.suppress(Exception):
            self.obj.close()
        return self.pipe.end()


class CappedOutput:
    """``with CappedOutput():`` around one case; its output is re-printed, bounded, after."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and hasattr(os, "pipe")
        self.streams: list[_Stream] = []

    def __enter__(self) -> CappedOutput:
        if not self.enabled:
            return self
        try:
            for fd, name in ((1, "stdout"), (2, "stderr")):
                self.streams.append(_Stream(fd, name))
        except (OSError, ValueError, AttributeError):  # no descriptors to redirect: leave it
            self._restore()
            self.enabled = False
        return self

    def _restore(self) -> list[tuple[str, str]]:
        kept = []
        for stream in reversed(self.streams):
            kept.append((stream.name, stream.close()))
        self.streams = []
        return list(reversed(kept))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.enabled:
            return
        for name, text in self._restore():
            if text:
                stream = getattr(sys, name)
                with contextlib.suppress(Exception):
                    stream.write(text)
                    stream.flush()
