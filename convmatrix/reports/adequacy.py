"""The kill matrix: which cases of a matrix kill which seeded bug, and the smallest case set
that kills the same bugs.

Input: the base kernel's results on the matrix and, per seeded bug, its run's results (read
back from the database, one run per bug). A case *kills* a bug when the bug's result is bad
(failed, crashed, timed out, errored) while the base passed the same case; a case the base
does not pass kills nothing (adequacy refuses such a base anyway). The kill says *how*: the
outputs whose error went over its limit, the property checks that failed, or that the kernel
raised. ``minimize`` is a greedy set cover (most new kills first, cheaper case on ties)
followed by a pass that drops every case whose bugs the others already kill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.core.records import BAD_OUTCOMES, CaseResult

__all__ = [
    "AdequacyRow",
    "AdequacyView",
    "BugInfo",
    "BugRow",
    "Kill",
    "MinimizedSet",
    "build_adequacy_view",
    "minimize",
]


@dataclass(frozen=True)
class BugInfo:
    """A seeded bug's metadata (``convmatrix.kernels.doubles.seeded.Bug``, as plain data)."""

    name: str
    bug_class: str
    dimension: str
    source: str
    reach: str


@dataclass
class Kill:
    case_id: str
    case: str  # the readable case name
    suite: str
    how: list[str]  # outputs over their limit, failed properties, or "raised"


@dataclass
class BugRow:
    name: str
    bug_class: str
    dimension: str
    source: str
    reach: str
    run_id: int | None
    killed: bool
    kills: list[Kill]
    first_kill_s: float | None  # case seconds, in matrix order, up to the first kill
    seconds: float  # all the bug's case seconds
    how: list[str]  # every way it was caught (outputs, properties, raised)
    suites: list[str]  # suites holding a killing case


@dataclass
class AdequacyRow:
    case_id: str
    case: str
    suite: str
    kills: list[str]  # bugs this case kills
    unique: list[str]  # bugs only this case kills
    seconds: float  # the base kernel's time on it


@dataclass
class MinimizedSet:
    case_ids: list[str]
    cases: int
    seconds: float  # the base kernel's time on those cases
    of_cases: int
    of_seconds: float
    path: str | None = None


@dataclass
class AdequacyView:
    kind: str
    matrix: str
    base: str
    base_run_id: int | None
    database: str
    killed: int
    total: int
    score: float  # killed / total
    seconds: float  # wall seconds of the whole adequacy run (every run)
    bugs: list[BugRow]
    cases: list[AdequacyRow]
    by_dimension: dict[str, list[int]]  # dimension -> [killed, total]
    survivors: list[BugRow]
    sample: int | None = None  # cases sampled from the matrix (None: all)
    minimized: MinimizedSet | None = None
    notes: list[str] = field(default_factory=list)


def _how(result: CaseResult) -> list[str]:
    how = [o.output for o in result.outputs if not o.passed]
    how += [p.name for p in result.properties if not p.passed]
    if not how:
        how.append("raised" if result.outcome == "failed" else result.outcome)
    return how


def build_adequacy_view(
    *,
    matrix: str,
    base: str,
    base_run_id: int | None,
    database: str,
    base_results: Sequence[CaseResult],
    bug_results: Mapping[str, tuple[int | None, Sequence[CaseResult]]],
    bugs: Mapping[str, BugInfo],
    seconds: float,
    sample: int | None = None,
) -> AdequacyView:
    """The kill matrix of every bug in ``bug_results`` (name -> (run id, results)), cases
    in the order of ``base_results`` (the matrix's order)."""
    order = [r.case.id for r in base_results]
    passed = {r.case.id: r for r in base_results if r.outcome == "passed"}
    killers: dict[str, list[str]] = {case_id: [] for case_id in order}
    rows: list[BugRow] = []
    for name, (run_id, results) in bug_results.items():
        by_id = {r.case.id: r for r in results}
        kills, elapsed, first = [], 0.0, None
        for case_id in order:
            result = by_id.get(case_id)
            if result is None:
                continue
            elapsed += result.duration_s
            if case_id in passed and result.outcome in BAD_OUTCOMES:
                case = result.case
                kills.append(Kill(case_id, case.pytest_id, case.suite, _how(result)))
                killers[case_id].append(name)
                first = elapsed if first is None else first
        info = bugs[name]
        rows.append(
            BugRow(
                name=name,
                bug_class=info.bug_class,
                dimension=info.dimension,
                source=info.source,
                reach=info.reach,
                run_id=run_id,
                killed=bool(kills),
                kills=kills,
                first_kill_s=first,
                seconds=elapsed,
                how=sorted({h for k in kills for h in k.how}),
                suites=sorted({k.suite for k in kills}),
            )
        )
    n_killers = {row.name: len(row.kills) for row in rows}
    cases = [
        AdequacyRow(
            case_id=r.case.id,
            case=r.case.pytest_id,
            suite=r.case.suite,
            kills=killers[r.case.id],
            unique=[bug for bug in killers[r.case.id] if n_killers[bug] == 1],
            seconds=r.duration_s,
        )
        for r in base_results
    ]
    by_dimension: dict[str, list[int]] = {}
    for row in rows:
        tally = by_dimension.setdefault(row.dimension, [0, 0])
        tally[0] += row.killed
        tally[1] += 1
    killed = sum(row.killed for row in rows)
    return AdequacyView(
        kind="adequacy",
        matrix=matrix,
        base=base,
        base_run_id=base_run_id,
        database=database,
        killed=killed,
        total=len(rows),
        score=killed / len(rows) if rows else 0.0,
        seconds=seconds,
        bugs=rows,
        cases=cases,
        by_dimension=dict(sorted(by_dimension.items())),
        survivors=[row for row in rows if not row.killed],
        sample=sample,
    )


def minimize(cases: Iterable[AdequacyRow]) -> list[str]:
    """The ids of a small set of cases killing every bug any case kills: greedy set cover
    (most not-yet-killed bugs first, the cheaper case on ties, then matrix order), then a
    pass over the chosen cases, dearest first, dropping each one the others make redundant.
    Returned in matrix order."""
    rows = [c for c in cases if c.kills]
    position = {c.case_id: i for i, c in enumerate(rows)}
    left = {bug for c in rows for bug in c.kills}
    chosen: list[AdequacyRow] = []
    while left:
        best = max(rows, key=lambda c: (len(left & set(c.kills)), -c.seconds, -position[c.case_id]))
        chosen.append(best)
        left -= set(best.kills)
    for case in sorted(chosen, key=lambda c: -c.seconds):
        others = [c for c in chosen if c is not case]
        if {b for c in others for b in c.kills} >= set(case.kills):
            chosen = others
    return [c.case_id for c in sorted(chosen, key=lambda c: position[c.case_id])]
