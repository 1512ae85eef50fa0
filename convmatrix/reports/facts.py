"""Facts of a call that no matrix dimension names, derived from the case, as explanation
candidates beside the dimensions (``reports.explain``).

A bug is often triggered by what the kernel receives rather than by what the matrix says: fla
PR #871 broke dS only when dy reached the kernel as a non-contiguous view, a fact that follows
from ``grad_layout`` and that no dimension carries as such. Each fact here is a label of a case,
like a dimension's (``reports.dimensions``), computed from the ``Case`` alone: the strides the
runners give its tensors (``core.layout.storage_layout``, the one definition they use;
``runners.case.inputs`` builds the views from it), its first sequence against K-1, and its length
against the tile the kernel declared. Pure arithmetic, no tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.layout import storage_layout

__all__ = ["FACTS", "contiguous", "dy_contiguity", "first_sequence", "length_vs_tile"]


def contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's ``is_contiguous`` of a view: row-major strides, dimensions of size 1 free."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _placed(shape: tuple[int, int, int], layout: str, gap: str | None) -> str:
    strides, _, _ = storage_layout(shape, layout, gap)
    return "contiguous" if contiguous(shape, strides) else "strided"


def x_contiguity(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """Whether x (B, C, L) reaches the kernel contiguous (update cases: their token blocks)."""
    if case.op == "update":
        return "update"
    shape = (case.batch, case.dim, case.seqlen or 0)
    return f"x {_placed(shape, case.layout, case.gap)}"


def dy_contiguity(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """Whether dy reaches the kernel's backward contiguous: dense, a channel slice of a wider
    token-major gradient (``grad_layout: gapped``), or stride 0 (``expanded``)."""
    if case.op != "fwd_bwd":
        return "no dy"
    shape = (case.batch, case.dim, case.seqlen or 0)
    if case.grad_layout == "expanded":
        return f"dy {'contiguous' if contiguous(shape, (0, 0, 0)) else 'strided'}"
    if case.grad_layout == "gapped":
        return f"dy {_placed(shape, 'channel_last', 'channel_slice')}"
    return "dy contiguous"


def state_contiguity(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """Whether the initial state (B, C, K-1) reaches the kernel contiguous (it is laid out
    like x, without x's gap)."""
    if case.op == "update" or not case.initial_state or case.initial_state == "none":
        return "no state"
    shape = (case.batch, case.dim, case.width - 1)
    return f"state {_placed(shape, case.layout, None)}"


def first_sequence(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """The first sequence's length against K-1 (the state a kernel hands across a sequence
    start): the first packed segment, or the whole length."""
    if case.op == "update":
        return "update"
    segments = [n for n in case.seq_lens or (case.seqlen or 0,) if n > 0]
    first, k = (segments[0] if segments else 0), case.width - 1
    return (
        "first seq < K-1" if first < k else "first seq = K-1" if first == k else "first seq > K-1"
    )


def length_vs_tile(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """L against the time tile the kernel declared (``Geometry.time_tile``, or the matrix's
    ``tile`` symbol): below, one tile, whole tiles, or a partial last tile."""
    if case.op == "update":
        return "update"
    tile = (geometry or {}).get("time_tile") or (geometry or {}).get("tile")
    if not tile:
        return "no tile declared"
    length = case.seqlen or 0
    if length < tile:
        return "L < tile"
    if length == tile:
        return "L = tile"
    return "L > tile, whole tiles" if length % tile == 0 else "L > tile, partial tile"


# name -> label of a case given the run's geometry (the shape of ``reports.dimensions``).
FACTS: dict[str, Callable[[Case, Mapping[str, Any] | None], str]] = {
    "x contiguity": x_contiguity,
    "dy contiguity": dy_contiguity,
    "state contiguity": state_contiguity,
    "first sequence": first_sequence,
    "L vs tile": length_vs_tile,
}
