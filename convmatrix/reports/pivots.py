"""Pass rate and worst bound usage per output, grouped by one or two matrix dimensions (e_rel
and e_norm beside it; they stand in for it only where a run recorded no usage).

A pivot turns thousands of cases into a handful of rows where a pattern stands out: every row
of ``seqlen x layout`` passes except ``tile+1 / channel_last``. Only cases judged
numerically count (expected-error cases are reported apart, docs/spec.md §3); skipped cases are
counted but excluded from the pass rate, since they say nothing about the kernel's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.core.tolerances import OUTPUTS
from convmatrix.core.verdict import output_severity
from convmatrix.reports.dimensions import DIMENSIONS, ORDER, PIVOTS

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
    worst_usage: dict[str, float | None] = field(default_factory=dict)  # max bound usage


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


@dataclass
class _Prepared:
    """One numerically judged result, reduced once to what every pivot needs."""

    labels: dict[str, str]
    outcome: int  # 0 passed, 1 bad, 2 skipped
    # output, e_rel, e_norm, severity, bound usage
    metrics: list[tuple[str, float, float, float | None, float | None]]


def _prepare(
    results: Iterable[CaseResult], dims: set[str], geometry: Mapping[str, Any] | None
) -> list[_Prepared]:
    prepared = []
    for result in results:
        if result.case.expect != "ok":
            continue
        outcome = 0 if result.outcome == "passed" else 1 if result.outcome in BAD_OUTCOMES else 2
        prepared.append(
            _Prepared(
                labels={d: DIMENSIONS[d](result.case, geometry) for d in dims},
                outcome=outcome,
                metrics=[
                    (m.output, m.e_rel, m.e_norm, output_severity(m), m.bound_usage)
                    for m in result.outputs
                ],
            )
        )
    return prepared


def _bump(acc: list[float | None], i: int, value: float | None) -> None:
    """acc[i] = max(acc[i], value) where NaN beats every number and None is no value."""
    if value is None:
        return
    old = acc[i]
    if old is None or value != value or (old == old and value > old):
        acc[i] = value


def _pivot(dims: Sequence[str], prepared: Sequence[_Prepared]) -> Pivot:
    groups: dict[tuple[str, ...], tuple[list[int], dict[str, list[float | None]]]] = {}
    for item in prepared:
        key = tuple(item.labels[d] for d in dims)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([0, 0, 0], {})
        group[0][item.outcome] += 1
        worst_by_output = group[1]
        for output, e_rel, e_norm, sev, usage in item.metrics:
            acc = worst_by_output.get(output)
            if acc is None:
                acc = worst_by_output[output] = [None, None, None, None]
            _bump(acc, 0, e_rel)
            _bump(acc, 1, e_norm)
            _bump(acc, 2, sev)
            _bump(acc, 3, usage)
    rows = []
    for key in sorted(groups, key=lambda k: _sort_key(dims, k)):
        (passed, bad, skipped), worst = groups[key]
        rows.append(
            PivotRow(
                key=list(key), n=passed + bad + skipped, n_passed=passed, n_bad=bad,
                n_skipped=skipped, pass_rate=passed / (passed + bad) if passed + bad else None,
                worst_rel={o: w[0] for o, w in worst.items()},
                worst_norm={o: w[1] for o, w in worst.items()},
                worst_severity={o: w[2] for o, w in worst.items()},
                worst_usage={o: w[3] for o, w in worst.items()},
            )
        )  # fmt: skip
    seen = {o for row in rows for o in row.worst_rel}
    outputs = [o for o in OUTPUTS if o in seen] + sorted(seen - set(OUTPUTS))
    return Pivot(dims=list(dims), outputs=outputs, rows=rows)


def build_pivots(
    results: Sequence[CaseResult],
    geometry: Mapping[str, Any] | None = None,
    pivots: Sequence[Sequence[str]] = PIVOTS,
) -> list[Pivot]:
    """Every pivot in ``pivots`` that has more than one group. Each result is reduced once
    (labels, errors, severities); a 10,000-case run is then a few hundred thousand updates."""
    prepared = _prepare(results, {d for dims in pivots for d in dims}, geometry)
    built = (_pivot(dims, prepared) for dims in pivots)
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
