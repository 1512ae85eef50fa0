"""The matrix dimensions a report groups cases by, as short readable labels.

A pivot is only useful if its groups are the bug classes of docs/spec.md §3: "fails only at tile+1
with channel_last" needs lengths named by their relation to the kernel's tile (``tile+1``), not
as raw numbers that differ per kernel. The tile comes from the geometry the run recorded
(``Geometry`` fields as JSON, or the symbols the matrix resolved, ``tile``); without it
lengths are classed against the width K only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.dtypes import short_name

__all__ = [
    "DIMENSIONS",
    "ORDER",
    "PIVOTS",
    "dtype_label",
    "layout_label",
    "length_class",
    "length_order",
    "state_label",
]


def dtype_label(case: Case) -> str:
    """``bf16`` when x and weight share a dtype, else ``bf16/w f32``."""
    x, w = short_name(case.x_dtype), short_name(case.w_dtype)
    return x if x == w else f"{x}/w {w}"


def layout_label(case: Case) -> str:
    return case.layout if not case.gap else f"{case.layout}+{case.gap}"


def length_class(case: Case, geometry: Mapping[str, Any] | None = None) -> str:
    """The length's relation to K and to the time tile: ``1``, ``K-1``, ``tile+1``, ``3*tile``...

    Update cases have no sequence length: they are classed by the tokens per call.
    """
    if case.op == "update":
        return "update T=1" if case.tokens == 1 else "update T>1"
    length, k = case.seqlen or 0, case.width
    named = {1: "1", k - 1: "K-1", k: "K", k + 1: "K+1"}
    geometry = geometry or {}
    tile = geometry.get("time_tile") or geometry.get("tile")  # declared, or the matrix's symbol
    if tile:
        named.update({tile - 1: "tile-1", tile: "tile", tile + 1: "tile+1"})
    if length in named:
        return named[length]
    if not tile:
        return "< 2K" if length < 2 * k else ">= 2K"
    if length < tile:
        return "(K+1, tile-1)"
    n, rest = divmod(length, tile)
    if rest == 0:
        return f"{n}*tile"
    if rest == 1:
        return f"{n}*tile+1"
    if rest == tile - 1:
        return f"{n + 1}*tile-1"
    return "> tile (off boundary)"


_LENGTH_ORDER = ("1", "K-1", "K", "K+1", "< 2K", ">= 2K", "(K+1, tile-1)", "tile-1", "tile")


def length_order(label: str) -> tuple[int, int, int]:
    """Sort key of ``length_class`` labels, shortest first: ``1 < K-1 < ... < tile < tile+1 <
    2*tile-1 < 2*tile < 2*tile+1 < ... < off-boundary lengths < update classes``."""
    if label in _LENGTH_ORDER:
        return (0, _LENGTH_ORDER.index(label), 0)
    if label == "tile+1":
        return (1, 1, 1)
    if m := re.fullmatch(r"(\d+)\*tile([+-]1)?", label):
        return (1, int(m.group(1)), {"-1": -1, None: 0, "+1": 1}[m.group(2)])
    return (2, 0, 0) if label.startswith(">") else (3, 0, 0)


def state_label(case: Case) -> str:
    """Initial state, final state and its upstream gradient: ``init=random, final+dF``."""
    parts = [f"init={case.initial_state or 'none'}"]
    if case.final_state:
        parts.append("final+dF" if case.dfinal == "random" else "final")
    return ", ".join(parts)


def _update_label(case: Case) -> str:
    if case.op != "update":
        return "-"
    ring = "ring" if case.circular else "shift"
    return f"{ring}, slots={case.slots or 'none'}"


Label = Callable[[Case, Mapping[str, Any] | None], str]

# Every dimension a pivot can use: name -> label of a case (given the run's geometry).
DIMENSIONS: dict[str, Label] = {
    "op": lambda c, g: c.op,
    "K": lambda c, g: f"K={c.width}",
    "dtype": lambda c, g: dtype_label(c),
    "layout": lambda c, g: layout_label(c),
    "seqlen": length_class,
    "channels": lambda c, g: f"C={c.dim}",
    "batch": lambda c, g: f"B={c.batch}",
    "activation": lambda c, g: c.activation or "none",
    "bias": lambda c, g: "bias" if c.bias else "no bias",
    "state": lambda c, g: state_label(c),
    "packed": lambda c, g: "packed" if c.seq_lens is not None else "unpacked",
    "update": lambda c, g: _update_label(c),
}

# Dimensions whose labels do not sort well as text: label -> sort key.
ORDER: dict[str, Callable[[str], Any]] = {"seqlen": length_order}

# The pivots a run report shows: one or two dimensions each. Two-dimensional pivots catch
# interactions (a tile-boundary bug that only shows with one layout).
PIVOTS: tuple[tuple[str, ...], ...] = (
    ("K", "dtype"),
    ("seqlen", "layout"),
    ("op",),
    ("layout",),
    ("seqlen",),
    ("state",),
    ("packed",),
    ("activation", "bias"),
    ("channels",),
    ("batch",),
    ("update",),
)
