"""Where a case's tensors live in memory: the strides of each layout and gapped view.

The one definition of the layouts and gaps of docs/spec.md §3: the runners build real views
of a larger NaN-filled buffer with these strides, and kernel contracts that depend on strides
(Dao's channel-last alignment) ask the same function. Pure arithmetic, no tensors.
"""

from __future__ import annotations

__all__ = ["GUARD", "PAD", "storage_layout"]

GUARD = 8  # elements of NaN before and after every view
PAD = 8  # gap sizes: extra channels each side of a slice, row padding, batch padding


def storage_layout(
    shape: tuple[int, int, int], layout: str, gap: str | None
) -> tuple[tuple[int, ...], int, int]:
    """(strides of the logical (B, C, L) view, storage offset, storage size) for a layout/gap."""
    batch, dim, length = shape
    extra = 2 * PAD if gap == "channel_slice" else 0
    offset_c = PAD if gap == "channel_slice" else 0
    row_pad = PAD if gap == "row_pad" else 0
    batch_pad = PAD if gap == "batch_pad" else 0
    if layout == "channel_last":  # storage (B, L, C'): channels innermost
        row = dim + extra + row_pad
        sb = length * row + batch_pad
        strides, offset = (sb, 1, row), GUARD + offset_c
    else:  # storage (B, C', L'): time innermost
        row = length + row_pad
        sb = (dim + extra) * row + batch_pad
        strides, offset = (sb, row, 1), GUARD + offset_c * row
    return strides, offset, GUARD + batch * sb + GUARD
