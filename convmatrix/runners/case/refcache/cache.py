"""The reference cache a run reads and writes: a directory of entries, the run's admission,
and the counters.

- ``read`` hands out an entry's blocks, each checked first; an entry that fails (its key, its
  header, a block's checksum: ``entry.Damaged``) is counted, removed, and the rest of the
  case is computed: a miss, never a wrong reference.
- ``write`` stores a case's blocks; anything raised (a full disk makes ``write`` raise
  ``OSError``; torch or a bug could raise anything else) is counted and the case goes on as
  it was, the temporary file removed (``entry.write_entry``). An entry over the limit is
  not kept. After a write, ``directory.CacheDir.evict`` keeps the directory within its limit.
- ``admits``: only the cases of the run's ``footprint.Admission`` are read or written (all of
  them when no admission is given).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from convmatrix.core.case import Case
from convmatrix.runners.case.refcache.compact import StoredBlock
from convmatrix.runners.case.refcache.directory import DEFAULT_LIMIT_BYTES, CacheDir
from convmatrix.runners.case.refcache.entry import Damaged, Entry, write_entry
from convmatrix.runners.case.refcache.footprint import Admission
from convmatrix.runners.case.refcache.key import Key

__all__ = ["ReferenceCache"]


@dataclass
class ReferenceCache:
    """A cache directory (created on first write) holding at most ``limit_bytes``, read and
    written only for the cases ``admission`` admits (None: every case)."""

    root: Path
    limit_bytes: int = DEFAULT_LIMIT_BYTES
    admission: Admission | None = None

    @property
    def directory(self) -> CacheDir:
        return CacheDir(self.root, self.limit_bytes)

    def admits(self, case: Case) -> bool:
        """Whether ``case``'s reference is read from and written to the cache; a case left
        out is counted (``skipped``)."""
        if self.admission is None or case.id in self.admission.admitted:
            return True
        self.directory.count("skipped")
        return False

    def read(self, key: Key, spans: list[tuple[int, int] | None]) -> Iterator[StoredBlock]:
        """The blocks of ``key``'s entry (``spans``, in order), each checked before it is
        handed out; fewer (none for a miss) when the entry is absent or fails a check. A hit
        touches the entry: the last to be evicted."""
        directory = self.directory
        path = directory.path_of(key.hex)
        done = 0
        try:
            entry = Entry.open(path, key)
            if entry is None:
                directory.count("miss")
                return
            for block in entry.blocks():
                if block.span != spans[done]:
                    raise Damaged(f"block {done} covers {block.span}, not {spans[done]}")
                done += 1
                yield block
            if done != len(spans):
                raise Damaged(f"{done} blocks, not {len(spans)}")
        except Exception:  # ``Damaged``, or a header no checksum covers the meaning of
            directory.count("damaged")
            directory.remove_entry(key.hex)
            return
        directory.count("hit")
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # used now: the last to be evicted

    def write(self, key: Key, blocks: list[StoredBlock]) -> bool:
        """Store ``blocks`` under ``key``; False (counted) when it could not be kept."""
        directory = self.directory
        path = directory.path_of(key.hex)
        held = [t for b in blocks for t in (*b.refs.values(), *b.bounds.values())]
        if sum(t.numel() * t.element_size() for t in held) > self.limit_bytes:
            return False  # never kept: not worth writing
        try:
            size = write_entry(path, key, [b.cpu() for b in blocks])
        except Exception:  # a full or read-only cache, or anything else: run on without it
            directory.count("write_failed")
            return False
        if size > self.limit_bytes:
            directory.remove_entry(key.hex)
            return False
        directory.count("stored")
        directory.evict()
        return True

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Around a run: before it, say when its references exceed the limit (and what is
        kept); after it, one line when entries failed their check or could not be written,
        counted from the counters every process of the run adds to (another run on the same
        directory at the same time adds its own)."""
        if self.admission is not None and self.admission.over:
            print(self.admission.note(str(self.root)), flush=True)
        before = self.directory.stats()
        yield
        after = self.directory.stats()
        damaged = after["damaged"] - before["damaged"]
        failed = after["write_failed"] - before["write_failed"]
        if damaged or failed:
            print(
                f"reference cache: warning: {damaged} entr{'y' if damaged == 1 else 'ies'} "
                f"failed a check (damaged, or another case's) and were recomputed, "
                f"{failed} could not be written; verdicts are unaffected "
                f"(convmatrix cache --reference-cache {self.root})",
                flush=True,
            )
