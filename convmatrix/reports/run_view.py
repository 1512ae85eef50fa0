"""The run report's view-model: did tonight's run pass, and if not, where and how badly.

Built from one run's ``CaseResult`` records and its header; rendering and JSON both start here.
Failures come first, each with the outputs that failed (errors against the threshold and
against the framework path) and the command that reruns exactly that case.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.records import BAD_OUTCOMES, CaseResult, OutputMetrics
from convmatrix.core.verdict import case_severity, judged_dtype, output_severity, worst
from convmatrix.reports.explain import Explanation, explain
from convmatrix.reports.pivots import Pivot, build_pivots
from convmatrix.reports.timing_view import PerformanceSection, build_performance_section
from convmatrix.reports.viewmodel import RunHeader
from convmatrix.runners.options import RunOptions

__all__ = [
    "CaseLine",
    "ExpectedErrorLine",
    "OutputLine",
    "RunView",
    "TimingLine",
    "build_run_view",
    "rerun_command",
]

_OUTCOME_ORDER = {"crashed": 0, "lost": 1, "timeout": 2, "error": 3, "failed": 4}


@dataclass
class OutputLine:
    """One output's errors, its limits and the framework path's errors at the same dtype."""

    output: str
    passed: bool
    e_abs: float
    e_rel: float
    e_norm: float
    limit_rel: float | None
    limit_norm: float | None
    fw_rel: float | None
    fw_norm: float | None
    vs_fw_rel: float | None  # e_rel / fw_rel: > 2 breaks flash-attention's rule
    vs_fw_norm: float | None
    severity: float | None  # how much of what the verdict allowed: > 1 fails
    worst_index: list[int] | None
    bound_usage: float | None = None  # max |a-r| / bound (docs/spec.md §4)
    usage_limit: float | None = None  # the usage allowed when the bound judged
    dtype: str | None = None  # the dtype the output is judged in (core.verdict.judged_dtype)
    broken_zeros: int | None = None  # elements expected exactly 0 that came out non-zero


@dataclass
class CaseLine:
    """A failing case: its parameters, what failed, and how to rerun it."""

    case_id: str
    name: str
    outcome: str
    message: str | None
    params: dict[str, Any]
    outputs: list[OutputLine]  # failing outputs first
    failed_properties: list[dict[str, Any]]
    severity: float  # how far past its limit the worst failing output is (inf: no numbers)
    rerun: str
    # The one measure of the header: the largest bound usage of the failing outputs the bound
    # judged, what they were allowed, and their elements expected exactly 0 that are not.
    worst_usage: float | None = None
    usage_limit: float | None = None
    broken_zeros: int = 0


@dataclass
class ExpectedErrorLine:
    case_id: str
    name: str
    outcome: str  # passed: the kernel raised a clean error
    reason: str | None  # why the matrix expects an error
    message: str | None  # what the kernel said (or why it failed)


@dataclass
class TimingLine:
    case_id: str
    name: str
    scope: str
    mode: str | None
    median_s: float
    min_s: float
    iqr_s: float
    n: int
    cold_s: float | None
    floor_s: float | None
    efficiency: float | None


@dataclass
class RunView:
    kind: str
    run: RunHeader
    failures: list[CaseLine]
    pivots: list[Pivot]
    expected_errors: list[ExpectedErrorLine]
    timings: list[TimingLine]
    skipped: dict[str, int] = field(default_factory=dict)  # skip reason -> cases
    rerun_all_failed: str | None = None
    where: list[Explanation] = field(default_factory=list)  # why the failing cases fail
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, summed
    performance: PerformanceSection | None = None  # scopes side by side, rates, sweeps


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def output_line(m: OutputMetrics, case: Case | None = None) -> OutputLine:
    return OutputLine(
        output=m.output,
        passed=m.passed,
        e_abs=m.e_abs,
        e_rel=m.e_rel,
        e_norm=m.e_norm,
        limit_rel=m.limit_rel,
        limit_norm=m.limit_norm,
        fw_rel=m.fw_rel,
        fw_norm=m.fw_norm,
        vs_fw_rel=_ratio(m.e_rel, m.fw_rel),
        vs_fw_norm=_ratio(m.e_norm, m.fw_norm),
        severity=output_severity(m),
        worst_index=m.worst_index,
        bound_usage=m.bound_usage,
        usage_limit=m.usage_limit,
        dtype=None if case is None else judged_dtype(m.output, case),
        broken_zeros=m.broken_zeros,
    )


def rerun_command(run: RunHeader, case_ids: Sequence[str]) -> str:
    """The ``convmatrix run`` command line that reruns exactly these cases of this run, as it
    ran and judged them (``RunOptions.rerun``: its ``--policy`` rule, reference device...)."""
    named = RunOptions(matrix=run.matrix, kernel=run.kernel, device=run.device.split(" ", 1)[0])
    rerun = RunOptions.from_recorded(run.rerun or named.recorded(), cases=list(case_ids))
    return shlex.join(["convmatrix", "run", *rerun.to_argv()])


def _params(result: CaseResult) -> dict[str, Any]:
    data = result.case.to_json()
    drop = {"id", "suite", "checks", "timed", "expect_reason"}
    return {k: v for k, v in data.items() if v is not None and k not in drop}


def _case_line(run: RunHeader, result: CaseResult) -> CaseLine:
    lines = sorted(
        (output_line(m, result.case) for m in result.outputs),
        key=lambda o: (o.passed, -(o.severity or 0.0)),
    )
    by_bound = [m for m in result.outputs if not m.passed and m.usage_limit is not None]
    return CaseLine(
        case_id=result.case.id,
        name=result.case.pytest_id,
        outcome=result.outcome,
        message=result.message,
        params=_params(result),
        outputs=lines,
        failed_properties=[
            {"name": p.name, "detail": p.detail} for p in result.properties if not p.passed
        ],
        severity=case_severity(result),
        rerun=rerun_command(run, [result.case.id]),
        worst_usage=worst(m.bound_usage for m in by_bound),
        usage_limit=max((m.usage_limit for m in by_bound if m.usage_limit), default=None),
        broken_zeros=sum(m.broken_zeros or 0 for m in by_bound),
    )


def _timing_lines(results: Sequence[CaseResult]) -> list[TimingLine]:
    lines = [
        TimingLine(
            case_id=r.case.id,
            name=r.case.pytest_id,
            scope=t.scope,
            mode=t.mode,
            median_s=t.median_s,
            min_s=t.min_s,
            iqr_s=t.iqr_s,
            n=t.n,
            cold_s=t.cold_s,
            floor_s=t.floor_s,
            efficiency=t.efficiency,
        )
        for r in results
        for t in r.timings
    ]
    lines.sort(key=lambda t: (t.scope, t.efficiency if t.efficiency is not None else 2.0))
    return lines


def build_run_view(run: RunHeader, results: Sequence[CaseResult]) -> RunView:
    """The whole run report from one run's results; ``run`` as built by ``run_header``."""
    failing = [r for r in results if r.outcome in BAD_OUTCOMES]
    failures = [_case_line(run, r) for r in failing]
    # Crashes and hangs first, then the worst failures in the terminal summary's order.
    failures.sort(key=lambda f: (_OUTCOME_ORDER.get(f.outcome, 9), -f.severity))
    expected = [
        ExpectedErrorLine(
            case_id=r.case.id,
            name=r.case.pytest_id,
            outcome=r.outcome,
            reason=r.case.expect_reason,
            message=r.message,
        )
        for r in results
        if r.case.expect == "error"
    ]
    expected.sort(key=lambda e: (e.outcome == "passed", e.name))
    skipped = Counter(r.message or "(no reason given)" for r in results if r.outcome == "skipped")
    pivots = build_pivots(results, run.geometry)
    return RunView(
        kind="run",
        run=run,
        failures=failures,
        pivots=pivots,
        expected_errors=expected,
        timings=_timing_lines(results),
        skipped=dict(skipped.most_common()),
        rerun_all_failed=rerun_command(run, [f.case_id for f in failures]) if failures else None,
        where=explain(
            [r.case for r in results if r.outcome == "passed" or r.outcome in BAD_OUTCOMES],
            [r.case.id for r in failing],
            run.geometry,
        ),
        performance=build_performance_section(results, run.geometry),
        phases=summed_phases(results),
    )


def summed_phases(results: Sequence[CaseResult]) -> dict[str, float]:
    """Seconds per phase over every case (``runners.case.phases``): whether the run was bound by
    the device or by the host judging it."""
    total: dict[str, float] = {}
    for r in results:
        for name, seconds in r.phases.items():
            total[name] = total.get(name, 0.0) + seconds
    return {name: round(seconds, 3) for name, seconds in total.items()}
