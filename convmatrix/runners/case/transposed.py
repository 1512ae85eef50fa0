"""Copies between a densely channel-last (B, C, L) tensor and a channel-first one, through
torch's blocked 2-D transpose.

torch's general copy of a dense channel-last float32 output into a channel-first float64
reference's layout took 6.3 ns an element (B=2, C=256, L=4096, one thread): 9x the same copy
from a channel-last view with gapped rows (a channel slice), which torch walks in a better
order, and 15x a straight copy. Its blocked transpose (``copy_same_type_transpose_``) takes
only a 2-D, same-dtype, densely transposed source into a contiguous destination; so each
batch row goes through it in the source's dtype, and the dtype changes on the straight
side: 4.8x faster there (bfloat16 and float16 2.1-2.4x; placing a case's channel-last
inputs 1.3-1.5x). Gapped rows and channel blocks keep torch's copy, faster for them.
"""

from __future__ import annotations

import torch

__all__ = ["copy_into"]

# torch takes its blocked path from 60 x 60 elements on; below, the general copy is as good.
_BLOCKED = 60 * 60
# Channel-last rows this far apart (bytes) make torch's copy of a channel block slow (a page
# or more per short row: 5.5-6.1 ns an element at 2064-4128 float32 channels, 0.7 at 272):
# the block is made dense first, a straight copy of each row (1.5 ns an element).
_FAR = 4096


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)``, the same values bit for bit, through the blocked transpose where
    torch's own copy between a channel-last and a channel-first 3-D tensor on the CPU is
    slow: from a dense channel-last tensor or a channel block of a wide one, and into any
    channel-last one (placing a case's inputs: 5-8x at 1040-4128 channels)."""
    if not _planes(dst, src):
        return dst.copy_(src)
    if _col_major(src[0]) and _row_major(dst[0]) and _slow_read(src[0]):
        for b in range(src.shape[0]):
            _copy_2d(dst[b], src[b])
    elif _row_major(src[0]) and _col_major(dst[0]):
        for b in range(src.shape[0]):
            _copy_2d(dst[b].t(), src[b].t())
    else:
        dst.copy_(src)
    return dst


def _planes(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return (
        dst.dim() == 3
        and dst.shape == src.shape
        and dst.device.type == "cpu"
        and src.device.type == "cpu"
        and dst.shape[1] > 1
        and dst.shape[2] > 1
        and dst[0].numel() >= _BLOCKED
    )


def _row_major(t: torch.Tensor) -> bool:
    return t.stride(1) == 1 and t.stride(0) >= t.shape[1]


def _col_major(t: torch.Tensor) -> bool:
    return t.stride(0) == 1 and t.stride(1) >= t.shape[0]


def _slow_read(t: torch.Tensor) -> bool:
    """Whether torch's copy out of column-major ``t`` is its slow walk: ``t`` dense, or a
    block of channels from rows far apart (whole rows with a gap between them it copies
    faster than a dense copy first would)."""
    apart = t.stride(1)
    return apart == t.shape[0] or (apart * t.element_size() >= _FAR and apart >= 2 * t.shape[0])


def _copy_2d(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst`` row-major, ``src`` column-major, both (m, n), rows of either possibly apart."""
    m, n = src.shape
    if src.stride(1) != m:  # columns apart: made dense by a straight copy (both row-major)
        dense = torch.empty((n, m), dtype=src.dtype)
        dense.copy_(src.t())
        src = dense.t()
    if dst.dtype == src.dtype and dst.is_contiguous():
        dst.copy_(src)  # the blocked transpose
        return
    plain = torch.empty((m, n), dtype=src.dtype)
    plain.copy_(src)  # the blocked transpose
    dst.copy_(plain)  # a straight copy (into rows apart, or to another dtype)
