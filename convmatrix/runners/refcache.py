"""The reference, computed once: a directory of float64 references and bound magnitudes keyed
by everything that determines them, reused across kernels, commits and nights.

A case's inputs are drawn from its id, so the float64 reference of a case is the same for
every kernel, every commit and every night; only what decides it may change it. The key is a
hash of: the reference's own version (``REFERENCE_VERSION``, moved whenever the oracle or the
bound model's magnitudes change), the channel blocks it is stored in, the case's parameters
(``Case.to_json``), and the bytes of the rounded inputs the reference reads (x, weight, bias,
initial state, the upstream gradients, seq_idx), so a change in how inputs are drawn or rounded is
a miss, never a stale hit. An entry is one ``torch.save`` file of the case's channel blocks
(``reference_blocks``' order): each block's outputs and magnitudes, on the CPU.

- Reading maps the file (``torch.load(mmap=True)``): the reference phase costs a few
  milliseconds, and the metrics read the pages they use (from the page cache when warm).
- Writing goes to a temporary file in the same directory, then ``os.replace``: workers that
  compute the same entry at once each write a whole file and the last rename wins, so a reader
  never sees half of one. Any host mounting the directory shares it.
- Size: at most ``limit_bytes`` (``--reference-cache-size``); after a write, the least recently
  used entries (a hit touches its file) are removed until it fits. An entry larger than the
  limit is not kept.
- A file that does not load (truncated by a full disk, written by another torch) is a miss,
  removed.

``REFERENCE_VERSION`` lives here, next to the key it makes: moving it invalidates every entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case

__all__ = ["DEFAULT_LIMIT_BYTES", "REFERENCE_VERSION", "ReferenceCache", "cache_key"]

# Move this whenever the float64 oracle, the magnitudes it computes, or the channel blocking
# change what a case's stored reference would be.
REFERENCE_VERSION = 1
DEFAULT_LIMIT_BYTES = 8 << 30  # 8 GiB
_SUFFIX = ".ref.pt"

Block = tuple[tuple[int, int] | None, dict[str, torch.Tensor], dict[str, Magnitudes]]


def _tensor_bytes(h: Any, t: torch.Tensor | None) -> None:
    if t is None:
        h.update(b"-")
        return
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def cache_key(case: Case, inputs: Any, spans: list[Any]) -> str:
    """The hex key of ``case``'s reference on ``inputs`` (forward inputs) in the channel blocks
    ``spans`` (see the module)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"convmatrix-reference-{REFERENCE_VERSION}-{spans}\n".encode())
    h.update(json.dumps(case.to_json(), sort_keys=True, default=str).encode())
    for guarded in (inputs.x, inputs.weight, inputs.bias, inputs.initial_state):
        _tensor_bytes(h, None if guarded is None else guarded.values)
    for t in (inputs.g, inputs.q, inputs.seq_idx):
        _tensor_bytes(h, t)
    return h.hexdigest()


def _plain_mags(mags: dict[str, Magnitudes]) -> dict[str, dict[str, Any]]:
    return {k: {"mag": m.mag, "n": m.n, "elem": m.elem, "zsens": m.zsens, "n_z": m.n_z}
            for k, m in mags.items()}  # fmt: skip


def _cpu(t: Any) -> Any:
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


@dataclass
class ReferenceCache:
    """A cache directory (created on first write) holding at most ``limit_bytes``."""

    root: Path
    limit_bytes: int = DEFAULT_LIMIT_BYTES

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{_SUFFIX}"

    def get(self, key: str) -> list[Block] | None:
        """The cached blocks of ``key`` (CPU tensors, memory-mapped), or None."""
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            data = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
            blocks = [
                (None if span is None else tuple(span), refs,
                 {k: Magnitudes(**m) for k, m in mags.items()})
                for span, refs, mags in data["blocks"]
            ]  # fmt: skip
        except Exception:  # truncated, foreign, or removed meanwhile: recompute
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        return blocks  # type: ignore[return-value]

    def put(self, key: str, blocks: list[Block]) -> None:
        """Store ``blocks`` under ``key`` (atomically), then evict to the size limit."""
        data = {"version": REFERENCE_VERSION, "blocks": [
            (None if span is None else list(span),
             {k: _cpu(v) for k, v in refs.items()},
             {k: {f: _cpu(v) for f, v in m.items()} for k, m in _plain_mags(mags).items()})
            for span, refs, mags in blocks
        ]}  # fmt: skip
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=_SUFFIX)
            with os.fdopen(fd, "wb") as out:
                torch.save(data, out)
            if os.path.getsize(tmp) > self.limit_bytes:
                os.unlink(tmp)
                return
            os.replace(tmp, path)
        except OSError:  # a full or read-only cache: the run goes on without it
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            return
        self.evict()

    def entries(self) -> Iterator[os.DirEntry[str]]:
        if not self.root.is_dir():
            return
        for sub in os.scandir(self.root):
            if sub.is_dir():
                for entry in os.scandir(sub.path):
                    if entry.name.endswith(_SUFFIX) and not entry.name.startswith(".tmp-"):
                        yield entry

    def evict(self) -> None:
        """Remove the least recently used entries until the directory fits its limit."""
        found = []
        for entry in self.entries():
            with contextlib.suppress(OSError):
                stat = entry.stat()
                found.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in found)
        for _, size, path in sorted(found):
            if total <= self.limit_bytes:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size
