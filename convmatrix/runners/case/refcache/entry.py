"""One entry's file: its whole key, a table of its tensors, and a checksum per channel block,
checked on every read.

    MAGIC (8) | header length (u64) | CRC-32 of the header (u32) | 0 (u32) | header (JSON)
    | zeros to 64 | block 0's tensors (each 64-aligned) | block 1's | ...

The header holds the key's text (``key.Key``) and, per block, its span, its byte range and
the CRC-32 of that range, and each tensor's output, part (r, lo, bound or mag), dtype, shape
and offset. Reading maps the file (copy-on-write: the tensors are views of the mapping,
nothing is copied) and checks a block's CRC-32 over the mapped bytes just before its tensors
are handed out: the metrics then read those pages hot. CRC-32 finds every damage of up to 32
consecutive bits (one flipped byte always) and misses random damage with probability 2^-32;
``zlib.crc32`` runs at 1.7 GB/s here, against 0.5 GB/s for BLAKE2b
(benchmarks/bench_refcache.py measures it). A swapped or copied entry fails on its key, not
its CRC.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from convmatrix.core.dtypes import torch_dtype
from convmatrix.runners.case.refcache.compact import StoredBlock
from convmatrix.runners.case.refcache.directory import SUFFIX, TMP_PREFIX
from convmatrix.runners.case.refcache.key import Key

__all__ = ["Damaged", "Entry", "write_entry"]

MAGIC = b"CMREF\x00\x00\x04"  # 4: r split, bounds in bfloat16 (16 bytes an element)
_HEAD = struct.Struct("<8sQII")
_ALIGN = 64


class Damaged(Exception):
    """An entry that is not what its name says (checksum, key or format): a miss."""


def _pad(n: int) -> int:
    return -n % _ALIGN


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of ``t`` (CPU), without a copy where it is contiguous already."""
    t = t.detach().contiguous()
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _table(blocks: list[StoredBlock]) -> tuple[list[dict[str, Any]], list[list[memoryview]]]:
    """The header's block table (offsets from the payload's start) and each block's pieces
    (tensor bytes and alignment zeros) in file order."""
    table, pieces, offset = [], [], 0
    for block in blocks:
        start, parts, tensors = offset, [], []
        for part, held in block.parts():
            for name, t in held.items():
                raw = _raw(t)
                tensors.append([name, part, str(t.dtype).removeprefix("torch."), list(t.shape),
                                offset])  # fmt: skip
                parts += [raw, memoryview(bytes(_pad(raw.nbytes)))]
                offset += raw.nbytes + _pad(raw.nbytes)
        crc = 0
        for p in parts:
            crc = zlib.crc32(p, crc)
        span = None if block.span is None else list(block.span)
        table.append({"span": span, "start": start, "end": offset, "crc": crc, "tensors": tensors})
        pieces.append(parts)
    return table, pieces


def write_entry(path: Path, key: Key, blocks: list[StoredBlock]) -> int:
    """Write ``blocks`` under ``key`` to ``path`` through a temporary file in its directory
    and ``os.replace`` (a reader never sees half an entry); its size. Whatever goes wrong
    (a full disk, a read-only cache, anything raised), the temporary file is removed and
    the exception passes on: the caller decides the run goes on without the entry."""
    table, pieces = _table(blocks)
    header = json.dumps({"key": key.hex, "text": key.text, "blocks": table}).encode()
    head = _HEAD.pack(MAGIC, len(header), zlib.crc32(header), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            out.write(header)
            out.write(bytes(_pad(len(head) + len(header))))
            for parts in pieces:
                for p in parts:
                    out.write(p)
            size = out.tell()
        os.replace(tmp, path)
    except BaseException:  # even an interrupt: no temporary file stays behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return size


@dataclass
class Entry:
    """An entry opened and its header checked against the key; its blocks are checked one by
    one as ``blocks`` hands them out."""

    mapped: mmap.mmap
    payload: int  # the payload's offset in the file
    table: list[dict[str, Any]]

    @classmethod
    def open(cls, path: Path, key: Key) -> Entry | None:
        """The entry at ``path`` if there is one (None), ``Damaged`` if it is not ``key``'s
        or its header fails its check. A link is refused (``O_NOFOLLOW``)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Damaged(f"cannot be opened ({exc.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD.size:
                raise Damaged(f"{size} bytes: shorter than its header")
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        magic, length, crc, _ = _HEAD.unpack_from(mapped, 0)
        end = _HEAD.size + length
        if magic != MAGIC or end > size:
            raise Damaged("not an entry of this version")
        header = bytes(memoryview(mapped)[_HEAD.size : end])
        if zlib.crc32(header) != crc:
            raise Damaged("its header fails its checksum")
        meta = json.loads(header)
        if meta.get("key") != key.hex or meta.get("text") != key.text:
            raise Damaged("it holds another key (a copied or swapped entry)")
        payload = end + _pad(end)
        if payload + (meta["blocks"][-1]["end"] if meta["blocks"] else 0) != size:
            raise Damaged(f"{size} bytes, not the size its header gives")
        return cls(mapped, payload, meta["blocks"])

    def blocks(self) -> Iterator[StoredBlock]:
        """Each block, its bytes checked (``Damaged`` at the first that fails)."""
        view = memoryview(self.mapped)
        for i, row in enumerate(self.table):
            start, end = self.payload + row["start"], self.payload + row["end"]
            if zlib.crc32(view[start:end]) != row["crc"]:
                raise Damaged(f"block {i} fails its checksum")
            block = StoredBlock(None if row["span"] is None else tuple(row["span"]))
            for name, part, dtype, shape, offset in row["tensors"]:
                count = 1
                for n in shape:
                    count *= n
                t = torch.frombuffer(
                    self.mapped, dtype=torch_dtype(dtype), count=count,
                    offset=self.payload + offset,
                ) if count else torch.empty(0, dtype=torch_dtype(dtype))  # fmt: skip
                dict(block.parts())[part][name] = t.view(shape)
            yield block
