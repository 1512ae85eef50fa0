"""The dimensions a suite may vary, each declared once: type, ops it applies to, default, help.

A dimension value is parsed into a ``Value``: its ``label`` is the canonical spelling (used to
match rules and to report coverage), its ``data`` what the case builder resolves per case
(an int, a symbolic ``Expr``, a dtype name, a ``Packing`` ...). Values keep their YAML mark so
a value that cannot be resolved for some kernel is reported at the line it was written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convmatrix.core.case import GAPS, GRAD_LAYOUTS
from convmatrix.core.dtypes import ALIASES, CASE_DTYPES, case_dtype
from convmatrix.matrix.errors import Mark, MatrixError, did_you_mean
from convmatrix.matrix.source import YNode
from convmatrix.matrix.symbols import GEOMETRY_SYMBOLS, Expr, parse_expr

__all__ = [
    "DIMENSIONS",
    "DTYPE_ALIASES",
    "LATE_DIMENSIONS",
    "MAX_INT",
    "Dim",
    "Packing",
    "Value",
    "check_int",
    "dims_for",
    "parse_dtype",
    "resolve_int",
    "resolve_packing",
]

FWD_OPS = frozenset({"fwd", "fwd_bwd"})
ALL_OPS = frozenset({"fwd", "fwd_bwd", "update"})
_INT_SYMBOLS = ("K", *GEOMETRY_SYMBOLS)
MAX_INT = 2**31 - 1  # what the database's integer columns (and most kernels' indices) hold
_PACK_SYMBOLS = ("K", "L", *GEOMETRY_SYMBOLS)

# The spellings a matrix may use for a case dtype (float64 is the reference's, not a case's).
DTYPE_ALIASES = {alias: name for alias, name in ALIASES.items() if name in CASE_DTYPES}


@dataclass(frozen=True)
class Packing:
    """Packed sequences: explicit segment ``lengths`` (negative = padding tokens) or boundary
    positions ``at`` (where a new sequence starts) followed by ``pad`` padding tokens."""

    lengths: tuple[int | Expr, ...] | None = None
    at: tuple[int | Expr, ...] = ()
    pad: int | Expr = 0


@dataclass(frozen=True)
class Value:
    dim: str
    label: str
    data: Any
    mark: Mark
    path: str


@dataclass(frozen=True)
class Dim:
    name: str
    parse: Callable[[YNode], tuple[str, Any]]  # node -> (label, data); raises node.error
    ops: frozenset[str]
    default: Any  # a YAML scalar; _REQUIRED when the suite must declare it
    help: str


_REQUIRED = object()


# -- value parsers -------------------------------------------------------------------------
def check_int(value: int, node: YNode | Value) -> int:
    """``value`` if a database column (32-bit) holds it, else a MatrixError at ``node``."""
    if not -MAX_INT <= value <= MAX_INT:
        raise MatrixError(node.mark, node.path, f"{value} is out of range (at most 2^31-1)")
    return value


def _int_expr(node: YNode, symbols: tuple[str, ...] = _INT_SYMBOLS) -> tuple[str, int | Expr]:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise node.error(f"expected an integer or an expression like 'tile+1', got {value!r}")
    if isinstance(value, int):
        check_int(value, node)
        return str(value), value
    try:
        expr = parse_expr(value, symbols)
    except ValueError as exc:
        raise node.error(str(exc)) from None
    if not expr.names:
        number = check_int(expr.eval({}), node)
        return str(number), number
    return expr.text, expr


def _width(node: YNode) -> tuple[str, int]:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise node.error(f"width must be a positive integer, got {value!r}")
    check_int(value, node)
    return str(value), value


def parse_dtype(node: YNode, value: Any = None) -> str:
    raw = node.value if value is None else value
    dtype = case_dtype(raw)
    if dtype is None:
        hint = did_you_mean(str(raw), DTYPE_ALIASES) or f" (known: {', '.join(CASE_DTYPES)})"
        raise node.error(f"unknown dtype {raw!r}{hint}")
    return dtype


def _dtype(node: YNode) -> tuple[str, str]:
    name = parse_dtype(node)
    return name, name


def _dtype_pair(node: YNode) -> tuple[str, tuple[str, str]]:
    if node.is_list and len(node.value) == 2:
        x, w = (parse_dtype(n) for n in node.value)
    elif isinstance(node.value, str) and node.value.count("/") == 1:
        x, w = (parse_dtype(node, part.strip()) for part in node.value.split("/"))
    else:
        raise node.error(f"a dtype pair is 'x_dtype/w_dtype' or [x, w], got {node.plain()!r}")
    return f"{x}/{w}", (x, w)


def _bool(node: YNode) -> tuple[str, bool]:
    if not isinstance(node.value, bool):
        raise node.error(f"expected true or false, got {node.value!r}")
    return str(node.value).lower(), node.value


def _choice(*choices: str, nullable: bool = False) -> Callable[[YNode], tuple[str, Any]]:
    def parse(node: YNode) -> tuple[str, Any]:
        value = node.value
        if nullable and (value is None or value == "none"):
            return "none", None
        if value not in choices:
            known = (["none"] if nullable else []) + list(choices)
            hint = did_you_mean(str(value), known) or f" (choose from {', '.join(known)})"
            raise node.error(f"unknown value {value!r}{hint}")
        return value, value

    return parse


def _packing(node: YNode) -> tuple[str, Packing | None]:
    if node.value is None or node.value == "none":
        return "none", None
    if node.is_list:
        parts = [_int_expr(n, _PACK_SYMBOLS) for n in node.value]
        if not parts:
            raise node.error("packed segment lengths must not be empty")
        label = "[" + ",".join(p[0] for p in parts) + "]"
        return label, Packing(lengths=tuple(p[1] for p in parts))
    if node.is_map:
        node.check_keys(("at", "pad"))
        at_node, pad_node = node.get("at"), node.get("pad")
        at_items = [] if at_node is None else (at_node.value if at_node.is_list else [at_node])
        at = [_int_expr(n, _PACK_SYMBOLS) for n in at_items]
        pad = _int_expr(pad_node, _PACK_SYMBOLS) if pad_node is not None else ("0", 0)
        label = (
            "at[" + ",".join(p[0] for p in at) + "]" + (f"+pad{pad[0]}" if pad[0] != "0" else "")
        )
        return label, Packing(at=tuple(p[1] for p in at), pad=pad[1])
    raise node.error(
        "packed is none, a list of segment lengths (negative = padding tokens) "
        "or {at: [boundary positions], pad: N}"
    )


DIMENSIONS: Mapping[str, Dim] = {
    d.name: d
    for d in (
        Dim("width", _width, ALL_OPS, _REQUIRED, "kernel width K"),
        Dim("seqlen", _int_expr, FWD_OPS, _REQUIRED, "length L (symbols K, tile, ...)"),
        Dim("dim", _int_expr, ALL_OPS, _REQUIRED, "channels C"),
        Dim("batch", _int_expr, ALL_OPS, 1, "batch B"),
        Dim("x_dtype", _dtype, ALL_OPS, "float32", "dtype of x (and y, states)"),
        Dim("w_dtype", _dtype, ALL_OPS, "float32", "dtype of weight and bias"),
        Dim("dtype", _dtype_pair, ALL_OPS, None, "(x, weight) dtype pairs as 'x/w'"),
        Dim(
            "layout",
            _choice("channel_first", "channel_last"),
            ALL_OPS,
            "channel_first",
            "time-contiguous or channel-contiguous x",
        ),
        Dim("gap", _choice(*GAPS, nullable=True), ALL_OPS, None, "legal gapped (strided) view"),
        Dim("activation", _choice("silu", nullable=True), ALL_OPS, None, "none or silu"),
        Dim("bias", _bool, ALL_OPS, True, "with or without bias"),
        Dim(
            "initial_state",
            _choice("none", "zeros", "random"),
            FWD_OPS,
            "none",
            "initial state",
        ),
        Dim("final_state", _bool, FWD_OPS, False, "return the final state"),
        Dim("dfinal", _choice("zero", "random"), frozenset({"fwd_bwd"}), "zero", "dLoss/dF"),
        Dim("packed", _packing, FWD_OPS, None, "packed sequences (seq_idx)"),
        Dim("tokens", _int_expr, frozenset({"update"}), _REQUIRED, "tokens per update call"),
        Dim("steps", _int_expr, frozenset({"update"}), 1, "update calls in sequence"),
        Dim("state_len", _int_expr, frozenset({"update"}), "K-1", "conv_state length S"),
        Dim("circular", _bool, frozenset({"update"}), False, "ring buffer (cache_seqlens)"),
        Dim(
            "slots",
            _choice("identity", "permuted", "permuted_pad", nullable=True),
            frozenset({"update"}),
            None,
            "state_indices mapping",
        ),
        Dim(
            "grad_layout",
            _choice(*GRAD_LAYOUTS, nullable=True),
            frozenset({"fwd_bwd"}),
            None,
            "layout of the upstream gradient dy: dense, gapped or expanded (stride 0)",
        ),
    )
}


# Dimensions added after matrices were published: a suite has them only where it declares
# them (or an include entry sets them), so the strategies draw, and the ids they give, stay
# exactly what they were for every suite that does not.
LATE_DIMENSIONS = frozenset({"grad_layout"})


def dims_for(op: str) -> list[Dim]:
    """The dimensions that apply to ``op``, in canonical order."""
    return [d for d in DIMENSIONS.values() if op in d.ops]


def is_required(dim: Dim) -> bool:
    return dim.default is _REQUIRED


def resolve_int(data: int | Expr, env: Mapping[str, int]) -> int:
    """An int dimension value for one case; UnresolvedSymbol if env lacks a symbol."""
    return data if isinstance(data, int) else data.eval(env)


def resolve_packing(packing: Packing, env: Mapping[str, int]) -> tuple[int, ...]:
    """Segment lengths (negative = padding) for the case's seqlen ``env['L']``.

    ValueError says why the packing does not fit this length.
    """
    seqlen = env["L"]
    if packing.lengths is not None:
        lengths = tuple(resolve_int(v, env) for v in packing.lengths)
        if 0 in lengths:
            raise ValueError(f"segment lengths {list(lengths)} contain 0")
        if sum(abs(n) for n in lengths) != seqlen:
            raise ValueError(f"segment lengths {list(lengths)} do not sum to seqlen {seqlen}")
        if all(n < 0 for n in lengths):
            raise ValueError("every token is padding")
        return lengths
    at = [resolve_int(v, env) for v in packing.at]
    pad = resolve_int(packing.pad, env)
    live = seqlen - pad
    if pad < 0 or live < 1:
        raise ValueError(f"pad {pad} leaves no live token of seqlen {seqlen}")
    bounds = [0, *at, live]
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"boundaries {at} are not strictly inside (0, {live})")
    lengths = tuple(b - a for a, b in itertools.pairwise(bounds))
    return (*lengths, -pad) if pad else lengths
