"""Pass rate and worst error per output, grouped by one or two matrix dimensions.

A pivot turns thousands of cases into a handful of rows where a pattern stands out: every row
of ``length class x layout`` passes except ``tile+1 / channel_last``. Only cases judged
numerically count (expected-error cases are reported apart, SPEC.md §3); skipped cases are
counted but excluded from the pass rate, since they say nothing about the kernel's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convmatrix.matrix.tolerances import OUTPUTS
from convmatrix.reports.dimensions import DIMENSIONS, ORDER, PIVOTS
from convmatrix.reports.viewmodel import BAD_OUTCOMES, severity, worst
from convmatrix.runners.results import CaseResult

__all__ = ["Pivot", "PivotRow", "build_pivots"]


@dataclass
class PivotRow:
    key: list[str]  # one label per dimension of the pivot
    n: int = 0
    n_passed: int = 0
    n_bad: int = 0  # failed, crashed, timeout or error
    n_skipped: int = 0
    pass_rate: float | None = None  # n_passed / (n_passed + n_bad); None if nothing judged
    worst_rel: dict[str, float | None] = field(default_factory=dict)  # output -> max e_rel
    worst_norm: dict[str, float | None] = field(default_factory=dict)
    worst_severity: dict[str, float | None] = field(default_factory=dict)  # max error/limit


@dataclass
class Pivot:
    dims: list[str]
    outputs: list[str]  # the outputs any row has, in OUTPUTS order
    rows: list[PivotRow]

    @property
    def name(self) -> str:
        return " x ".join(self.dims)

    @property
    def informative(self) -> bool:
        """Worth showing: more than one group (a single row repeats the header's counts)."""
        return len(self.rows) > 1


def _row_for(groups: dict[tuple[str, ...], PivotRow], key: tuple[str, ...]) -> PivotRow:
    row = groups.get(key)
    if row is None:
        row = groups[key] = PivotRow(key=list(key))
    return row


def _add(row: PivotRow, result: CaseResult) -> None:
    row.n += 1
    if result.outcome == "passed":
        row.n_passed += 1
    elif result.outcome in BAD_OUTCOMES:
        row.n_bad += 1
    else:
        row.n_skipped += 1
    for m in result.outputs:
        row.worst_rel[m.output] = worst((row.worst_rel.get(m.output), m.e_rel))
        row.worst_norm[m.output] = worst((row.worst_norm.get(m.output), m.e_norm))
        row.worst_severity[m.output] = worst((row.worst_severity.get(m.output), severity(m)))


def build_pivot(
    dims: Sequence[str],
    results: Iterable[CaseResult],
    geometry: Mapping[str, Any] | None = None,
) -> Pivot:
    """One pivot over numerically judged results (``expect == "ok"``), rows sorted by key."""
    labels = [DIMENSIONS[d] for d in dims]
    groups: dict[tuple[str, ...], PivotRow] = {}
    seen_outputs: set[str] = set()
    for result in results:
        if result.case.expect != "ok":
            continue
        key = tuple(label(result.case, geometry) for label in labels)
        _add(_row_for(groups, key), result)
        seen_outputs.update(m.output for m in result.outputs)
    rows = [groups[k] for k in sorted(groups, key=lambda k: _sort_key(dims, k))]
    for row in rows:
        judged = row.n_passed + row.n_bad
        row.pass_rate = row.n_passed / judged if judged else None
    outputs = [o for o in OUTPUTS if o in seen_outputs]
    outputs += sorted(seen_outputs - set(outputs))
    return Pivot(dims=list(dims), outputs=outputs, rows=rows)


def build_pivots(
    results: Sequence[CaseResult],
    geometry: Mapping[str, Any] | None = None,
    pivots: Sequence[Sequence[str]] = PIVOTS,
) -> list[Pivot]:
    """Every pivot in ``pivots`` that has more than one group."""
    built = (build_pivot(dims, results, geometry) for dims in pivots)
    return [p for p in built if p.informative]


def _sort_key(dims: Sequence[str], key: tuple[str, ...]) -> tuple[Any, ...]:
    """Dimension-specific order where one is declared (lengths by size), else natural order:
    ``K=2`` before ``K=10``, numbers comparing as numbers."""
    out: list[Any] = []
    for dim, part in zip(dims, key, strict=True):
        if dim in ORDER:
            out.append(ORDER[dim](part))
            continue
        head, _, tail = part.partition("=")
        out.append((head, int(tail)) if tail.isdigit() else (part, -1))
    return tuple(out)
