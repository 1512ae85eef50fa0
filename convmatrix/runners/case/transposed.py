"""Copies between a channel-last (B, C, L) tensor and a channel-first one whose channel-last
rows lie far apart, through torch's blocked 2-D transpose.

torch's general copy walks the channel-last side one element per row; once rows are about a
page apart each element lands on another page, and the copy slows 5-10x: reading a dense
channel-last float32 output of 4128 channels into a channel-first float64 reference's layout
took 6.3 ns an element (one thread), a 63-channel block of it 5.9, placing contiguous values
into a channel-last view of 1040 channels 6.2 (into 256 channels 0.5). Its blocked
transpose (``copy_same_type_transpose_``) takes only a 2-D, same-dtype, densely transposed
source into a contiguous destination: so each batch row goes through it in the source's dtype
(a block made dense first by a straight copy of its rows) and the dtype changes on the
straight side.

Where rows are near, torch's copy is as fast or, on two threads, faster (it runs in parallel,
the blocked transpose does not): only far rows take this path, from ``_FAR_READ`` bytes
apart when reading a channel-last tensor and from ``_FAR_PLACE`` when writing one.
``benchmarks/bench_transposed.py`` measures both directions on one and two threads
(docs/benchmarks.md).
"""

from __future__ import annotations

import torch

__all__ = ["copy_into"]

# torch takes its blocked path from 60 x 60 elements on; below, the general copy is as good.
_BLOCKED = 60 * 60
_FAR_READ = 4096  # bytes between the rows of a channel-last source
_FAR_PLACE = 2048  # bytes between the rows of a channel-last destination


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)``, the same values bit for bit; through the blocked transpose where
    one of two 3-D tensors on the CPU is channel-last with rows far apart and the other
    channel-first."""
    if not _planes(dst, src):
        return dst.copy_(src)
    if _col_major(src[0]) and _row_major(dst[0]) and _far(src[0], _FAR_READ, block=True):
        for b in range(src.shape[0]):
            _copy_2d(dst[b], src[b])
    elif _row_major(src[0]) and _col_major(dst[0]) and _far(dst[0], _FAR_PLACE, block=False):
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


def _far(t: torch.Tensor, apart: int, block: bool) -> bool:
    """Whether the rows of column-major ``t`` lie ``apart`` bytes apart or more, and ``t``
    is dense or (``block``) a block of many more channels, else (not ``block``) dense or
    with gaps between whole rows. Read, whole rows with gaps torch copies as fast as a dense
    copy first would; written, a narrow block as fast as the blocked transpose."""
    rows, width = t.stride(1), t.shape[0]
    shape_fits = rows == width or (rows >= 2 * width) == block
    return rows * t.element_size() >= apart and shape_fits


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
