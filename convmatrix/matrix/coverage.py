"""What an expansion covers: each declared value, each pair of declared dimensions (against
the pairs some valid case can contain), and the checklist of docs/spec.md §3 computed from the
resolved cases themselves, so a matrix cannot claim "tile+1" without a case of that length.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from convmatrix.core.case import GAPS, Case
from convmatrix.core.dtypes import CASE_DTYPES
from convmatrix.matrix.expand import Expansion, SuiteExpansion

__all__ = ["Coverage", "PairCoverage", "SpecItem", "ValueCoverage", "coverage"]


@dataclass(frozen=True)
class ValueCoverage:
    suite: str
    dim: str
    value: str
    cases: int

    @property
    def covered(self) -> bool:
        return self.cases > 0


@dataclass(frozen=True)
class PairCoverage:
    suite: str
    dims: tuple[str, str]
    covered: int
    valid: int  # value pairs some valid case can contain
    missing: tuple[tuple[str, str], ...]

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class SpecItem:
    """One value of a row of docs/spec.md §3; ``applicable`` is False when it needs geometry the
    expansion lacks (e.g. 'tile+1' without a time tile)."""

    row: str
    value: str
    cases: int
    applicable: bool = True

    @property
    def covered(self) -> bool:
        return self.cases > 0 or not self.applicable


@dataclass(frozen=True)
class Coverage:
    values: tuple[ValueCoverage, ...]
    pairs: tuple[PairCoverage, ...]
    spec: tuple[SpecItem, ...]

    @property
    def complete(self) -> bool:
        return (
            all(v.covered for v in self.values)
            and all(p.complete for p in self.pairs)
            and all(s.covered for s in self.spec)
        )


def _rows(s: SuiteExpansion) -> list[list[int | None]]:
    """Generated rows plus include rows, as indices (None where a value is include-only)."""
    rows: list[list[int | None]] = [list(r) for r in s.rows]
    for inc in s.include_rows:
        row: list[int | None] = []
        for dim in s.dims:
            labels = [v.label for v in s.suite.dimensions[dim]]
            label = inc[dim].label
            row.append(labels.index(label) if label in labels else None)
        rows.append(row)
    return rows


def _suite_coverage(s: SuiteExpansion) -> tuple[list[ValueCoverage], list[PairCoverage]]:
    rows = _rows(s)
    dims = list(s.dims)
    values = []
    for dim in s.suite.declared:
        i = dims.index(dim)
        for v, value in enumerate(s.suite.dimensions[dim]):
            n = sum(1 for r in rows if r[i] == v)
            values.append(ValueCoverage(s.suite.name, dim, value.label, n))
    pairs = []
    for a, b in itertools.combinations(s.suite.declared, 2):
        i, j = dims.index(a), dims.index(b)
        seen = {(r[i], r[j]) for r in rows}
        covered = valid = 0
        missing = []
        for va, vb in itertools.product(
            range(len(s.suite.dimensions[a])), range(len(s.suite.dimensions[b]))
        ):
            partial: list[int | None] = [None] * len(dims)
            partial[i], partial[j] = va, vb
            if (va, vb) in seen:
                covered += 1
                valid += 1
            elif s.space.is_extendable(partial):
                valid += 1
                labels = (s.suite.dimensions[a][va].label, s.suite.dimensions[b][vb].label)
                missing.append(labels)
        pairs.append(PairCoverage(s.suite.name, (a, b), covered, valid, tuple(missing)))
    return values, pairs


def _boundaries(case: Case) -> list[int]:
    ends = list(itertools.accumulate(abs(n) for n in case.seq_lens or ()))
    return ends[:-1]


def _spec_items(cases: list[Case], geo: Mapping[str, int]) -> list[SpecItem]:
    ok = [c for c in cases if c.expect == "ok"]
    fwd = [c for c in ok if c.op != "update"]
    upd = [c for c in ok if c.op == "update"]
    tile, ctile, vec = geo.get("tile"), geo.get("ctile"), geo.get("vec")

    def near(p: int) -> bool:
        return tile is not None and p % tile in (0, 1, tile - 1)

    items: list[tuple[str, str, list[Case], Callable[[Case], bool], bool]] = []

    def add(row: str, value: str, pool: list[Case], pred: Callable[[Case], bool], app=True):
        items.append((row, value, pool, pred, app))

    for k in (2, 3, 4):
        add("width K", str(k), ok, lambda c, k=k: c.width == k)
    add("length L", "1", fwd, lambda c: c.seqlen == 1)
    add("length L", "K-1", fwd, lambda c: c.seqlen == c.width - 1)
    add("length L", "K", fwd, lambda c: c.seqlen == c.width)
    for name, off in (("tile-1", -1), ("tile", 0), ("tile+1", 1)):
        add("length L", name, fwd, lambda c, o=off: c.seqlen == (tile or 0) + o, tile is not None)
    add("length L", "several tiles", fwd, lambda c: c.seqlen > 2 * (tile or 0), tile is not None)
    for name, base, off in (("vec-1", vec, -1), ("vec+1", vec, 1), ("ctile", ctile, 0)):
        add(
            "channels C", name, ok, lambda c, b=base, o=off: c.dim == (b or 0) + o, base is not None
        )
    add("channels C", "ctile+1", ok, lambda c: c.dim == (ctile or 0) + 1, ctile is not None)
    add(
        "channels C",
        "non-multiple of ctile above it",
        ok,
        lambda c: c.dim > (ctile or 0) and c.dim % (ctile or 1) != 0,
        ctile is not None,
    )
    add("batch B", "1", ok, lambda c: c.batch == 1)
    add("batch B", "several", ok, lambda c: c.batch > 1)
    for layout in ("channel_first", "channel_last"):
        add("layout", layout, ok, lambda c, v=layout: c.layout == v)
    for gap in GAPS:
        add("layout", f"gapped: {gap}", ok, lambda c, v=gap: c.gap == v)
    add("activation", "none", ok, lambda c: c.activation is None)
    add("activation", "silu", ok, lambda c: c.activation == "silu")
    add("parameters", "bias", ok, lambda c: c.bias)
    add("parameters", "no bias", ok, lambda c: not c.bias)
    for x, w in itertools.product(CASE_DTYPES, CASE_DTYPES):
        add("parameters", f"{x}/{w}", ok, lambda c, x=x, w=w: (c.x_dtype, c.w_dtype) == (x, w))
    add("state", "zero initial state", fwd, lambda c: c.initial_state == "zeros")
    add("state", "non-zero initial state", fwd, lambda c: c.initial_state == "random")
    add(
        "state",
        "short chunk L < K-1 with a state",
        fwd,
        lambda c: c.seqlen < c.width - 1 and c.initial_state == "random" and bool(c.final_state),
    )
    add("state", "final state", fwd, lambda c: bool(c.final_state))
    add("state", "non-zero dF", fwd, lambda c: c.dfinal == "random")
    add(
        "packed",
        "boundary inside a tile",
        fwd,
        lambda c: any(not near(p) for p in _boundaries(c)),
        tile is not None,
    )
    add(
        "packed",
        "boundary next to a tile edge",
        fwd,
        lambda c: any(near(p) for p in _boundaries(c)),
        tile is not None,
    )
    add("packed", "padding tokens", fwd, lambda c: any(n < 0 for n in c.seq_lens or ()))
    add("update", "one token", upd, lambda c: c.tokens == 1)
    add("update", "several tokens", upd, lambda c: c.tokens > 1)
    add("update", "several steps", upd, lambda c: c.steps > 1)
    add("update", "state_len > K-1", upd, lambda c: c.state_len > c.width - 1)
    add("update", "ring buffer", upd, lambda c: bool(c.circular))
    add(
        "update",
        "ring wrap-around (tokens*steps > S)",
        upd,
        lambda c: bool(c.circular) and c.tokens * c.steps > c.state_len,
    )
    add("update", "slot permutation", upd, lambda c: c.slots in ("permuted", "permuted_pad"))
    add("update", "pad slots", upd, lambda c: c.slots == "permuted_pad")
    for op in ("fwd", "fwd_bwd", "update"):
        add("op", op, ok, lambda c, op=op: c.op == op)
    add("op", "expected error", cases, lambda c: c.expect == "error")
    return [
        SpecItem(row, value, sum(1 for c in pool if app and pred(c)), app)
        for row, value, pool, pred, app in items
    ]


def coverage(expansion: Expansion) -> Coverage:
    """Value, pair and docs/spec.md §3 coverage of ``expansion``."""
    values: list[ValueCoverage] = []
    pairs: list[PairCoverage] = []
    for suite in expansion.suites:
        v, p = _suite_coverage(suite)
        values += v
        pairs += p
    spec = _spec_items(expansion.cases, expansion.geometry)
    return Coverage(tuple(values), tuple(pairs), tuple(spec))
