"""The reference cache's directory: where it lives, what is in it, its size and its counters.
No torch: ``convmatrix cache`` reads and clears it without loading a tensor.

Layout (``ROOT`` is ``--reference-cache``, else ``$CONVMATRIX_REFERENCE_CACHE``, else
``$XDG_CACHE_HOME/convmatrix/reference`` with ``~/.cache`` for an unset ``XDG_CACHE_HOME``)::

    ROOT/ab/ab12...ef.ref       an entry (40 hex digits: its key; ``refcache.entry``'s format)
    ROOT/ab/.tmp-XXXX.ref       an entry being written (removed if it fails; stale after 1 h)
    ROOT/events                 one byte per event (hit, miss, damaged, ...): the counters

Nothing else is ever read, evicted or removed: only regular files with those names, inside
real two-hex-digit subdirectories, opened through directory descriptors without following a
link (``O_NOFOLLOW``; a name replaced by a link between listing and removal is refused, and
``unlink`` of a link removes the link, never its target). ``ROOT`` itself may be a link (a
``~/.cache`` on another disk is the user's choice). Version 1 entries (``*.ref.pt``,
``torch.save`` files) count towards the size and are evicted and cleared, never read.

Counters: each process appends one byte per event to ``events`` (``O_APPEND``: concurrent
writers never mix bytes); ``stats`` counts them. A nightly of 30,000 cases adds about 60 KB;
``convmatrix cache clear`` empties it with the entries.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "DEFAULT_LIMIT_BYTES",
    "EVENTS",
    "CacheDir",
    "CacheFile",
    "cache_directory",
    "default_directory",
]

CACHE_ENV = "CONVMATRIX_REFERENCE_CACHE"
DEFAULT_LIMIT_BYTES = 8 << 30  # 8 GiB
SUFFIX = ".ref"
TMP_PREFIX = ".tmp-"
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
_EVENTS_FILE = "events"
# Event -> the byte ``events`` holds for it.
EVENTS = {
    "hit": b"h",  # an entry read whole, every block verified
    "miss": b"m",  # no entry: computed (and stored, if admitted)
    "damaged": b"d",  # an entry failed its check (checksum, key, format): a miss, removed
    "stored": b"s",  # an entry written
    "write_failed": b"w",  # a write raised (full disk, read-only): the case went on without it
    "evicted": b"e",  # an entry removed to keep the directory under its limit
    "skipped": b"x",  # a case not admitted (``footprint.Admission``): never read nor written
}
_SUB = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{40}(\.ref|\.ref\.pt)")  # .ref.pt: version 1
_TMP = re.compile(r"\.tmp-[A-Za-z0-9_]+\.ref(\.pt)?")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def default_directory() -> str:
    """``$XDG_CACHE_HOME`` (``~/.cache``) ``/convmatrix/reference``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "convmatrix" / "reference")


def cache_directory(spec: str | None) -> str | None:
    """The reference cache's directory: ``spec``, else ``$CONVMATRIX_REFERENCE_CACHE``, else
    ``default_directory()``; None for ``off``."""
    spec = spec or os.environ.get(CACHE_ENV) or default_directory()
    if spec.strip().lower() == "off":
        return None
    return str(Path(spec).expanduser().resolve())


@dataclass(frozen=True)
class CacheFile:
    """One file of the cache: an entry (current or version 1) or a temporary one."""

    sub: str  # its two-hex-digit subdirectory
    name: str
    size: int
    mtime: float  # the last use of an entry (a hit touches it), the last write of a temp file
    temporary: bool


@dataclass
class CacheDir:
    """A cache directory (created on the first write) of at most ``limit_bytes``."""

    root: Path
    limit_bytes: int = DEFAULT_LIMIT_BYTES

    def path_of(self, key: str) -> Path:
        """Where the entry of ``key`` (40 hex digits) lives."""
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def files(self) -> Iterator[CacheFile]:
        """Every entry and temporary file, found without following a link."""
        with _opened(self.root, os.O_RDONLY | os.O_DIRECTORY) as root:
            if root is None:
                return
            for sub in sorted(os.listdir(root)):
                if not _SUB.fullmatch(sub):
                    continue
                with _opened(sub, _DIR_FLAGS, root) as fd:
                    if fd is not None:
                        yield from _files_in(sub, fd)

    def usage(self) -> tuple[int, int]:
        """(bytes, entries): what the entries and temporary files take, and how many entries."""
        found = list(self.files())
        return sum(f.size for f in found), sum(not f.temporary for f in found)

    def evict(self, now: float | None = None) -> int:
        """Remove stale temporary files, then the least recently used entries until the
        directory fits its limit; how many entries went."""
        now = time.time() if now is None else now
        found = list(self.files())
        for f in found:
            if f.temporary and now - f.mtime > STALE_TMP_S:
                self._remove(f)
        live = [f for f in found if not f.temporary or now - f.mtime <= STALE_TMP_S]
        total = sum(f.size for f in live)
        evicted = 0
        for f in sorted((f for f in live if not f.temporary), key=lambda f: (f.mtime, f.name)):
            if total <= self.limit_bytes:
                break
            if self._remove(f):
                total -= f.size
                evicted += 1
                self.count("evicted")
        return evicted

    def clear(self) -> tuple[int, int]:
        """Remove every entry, temporary file and the counters: (files, bytes) removed."""
        removed = freed = 0
        for f in list(self.files()):
            if self._remove(f):
                removed, freed = removed + 1, freed + f.size
        with _opened(self.root, os.O_RDONLY | os.O_DIRECTORY) as root:
            if root is not None:
                with contextlib.suppress(OSError):
                    os.unlink(_EVENTS_FILE, dir_fd=root)
                for sub in os.listdir(root):  # empty subdirectories (rmdir refuses the rest)
                    if _SUB.fullmatch(sub):
                        with contextlib.suppress(OSError):
                            os.rmdir(sub, dir_fd=root)
        return removed, freed

    def remove_entry(self, key: str) -> None:
        """Remove the entry of ``key`` (a damaged one), without following a link."""
        with _opened(self.root / key[:2], _DIR_FLAGS) as fd:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.unlink(f"{key}{SUFFIX}", dir_fd=fd)

    def _remove(self, f: CacheFile) -> bool:
        with _opened(self.root / f.sub, _DIR_FLAGS) as fd:
            if fd is None:
                return False
            try:
                if not stat.S_ISREG(os.stat(f.name, dir_fd=fd, follow_symlinks=False).st_mode):
                    return False  # replaced by a link or a directory since it was listed
                os.unlink(f.name, dir_fd=fd)
            except OSError:
                return False
        return True

    def count(self, event: str) -> None:
        """Add one ``event`` (``EVENTS``) to the counters; a cache that cannot take it (full,
        read-only) loses the count, never the run."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / _EVENTS_FILE, flags, 0o644)
        except OSError:
            return
        try:
            os.write(fd, EVENTS[event])
        except OSError:
            pass
        finally:
            os.close(fd)

    def stats(self) -> dict[str, int]:
        """How many of each event the counters hold (since the cache was last cleared)."""
        data = b""
        with contextlib.suppress(OSError):
            fd = os.open(self.root / _EVENTS_FILE, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        return {name: data.count(byte) for name, byte in EVENTS.items()}


@contextlib.contextmanager
def _opened(path: str | Path, flags: int, dir_fd: int | None = None) -> Iterator[int | None]:
    """A descriptor of ``path`` (relative to ``dir_fd``), or None where it cannot be opened
    (absent, a link under ``O_NOFOLLOW``, not a directory)."""
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _files_in(sub: str, fd: int) -> Iterator[CacheFile]:
    """The cache's files in the subdirectory open as ``fd``: regular files with an entry's or
    a temporary file's name (an entry in the subdirectory its key names), never a link."""
    for name in sorted(os.listdir(fd)):
        temporary = bool(_TMP.fullmatch(name))
        if not temporary and not (_ENTRY.fullmatch(name) and name.startswith(sub)):
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile
        if stat.S_ISREG(st.st_mode):
            yield CacheFile(sub, name, st.st_size, st.st_mtime, temporary)
