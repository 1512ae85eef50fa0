"""A budgeted search for what the matrix misses: drawn cases in rounds, failures shrunk.

``explore`` draws cases from the whole space (``search.space``), runs them in rounds through
a ``RoundRunner`` (the pipeline's: every round is a recorded run of the same engines as
``convmatrix run``), and stops when the budget is spent or ``max_failures`` distinct failures
were found. Each round is sized by what the cases before it cost, so the budget is overrun by
at most about one round (``round_s``); a round of many cases amortises the engine's start-up
(xdist workers import torch).

Then each failure is shrunk (``shrink``: the shrink helper's greedy delta debugging, each
candidate a real case) and failures whose shrunk cases agree are merged into one
``Finding``: one bug seen from many cases is one line of the matrix it writes. Shrinking is
bounded twice: each failure by ``shrink_runs`` case runs, and the failures shrunk by
``shrink_limit``, taken first-of-each-signature first (a kernel that fails every case would
otherwise spend hours shrinking the same bug); a failure not shrunk joins the finding of its
signature. The findings are written as a matrix (``findings_matrix``) that
``convmatrix run --matrix FILE`` runs for nightly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from convmatrix.core.case import Case
from convmatrix.matrix.build import case_elements
from convmatrix.search.space import CaseSpace, Drawn, case_entry, matrix_text

__all__ = [
    "ExploreReport",
    "ExploreSettings",
    "Failure",
    "Finding",
    "Progress",
    "RoundResult",
    "RoundRunner",
    "explore",
    "findings_matrix",
]


@dataclass(frozen=True)
class ExploreSettings:
    """How long and how wide to search (``convmatrix explore``'s options)."""

    budget_s: float
    seed: int = 0
    max_failures: int | None = None  # stop after this many distinct signatures (None: budget)
    round_s: float = 30.0  # a round's target duration
    max_round_cases: int = 64
    shrink_runs: int = 60  # case runs per shrink
    shrink_limit: int = 8  # failures shrunk in all


@dataclass(frozen=True)
class Failure:
    """A drawn case that failed, when (seconds into the search) and how (``signature``)."""

    case: Case
    signature: str
    found_s: float
    round: int
    run_id: int | None


@dataclass(frozen=True)
class RoundResult:
    """What one round's run gave: its recorded run and, per case id, the failure signature
    of each case that failed (``search.probe.signature_of``)."""

    run_id: int | None
    failures: dict[str, str]
    seconds: float


class RoundRunner(Protocol):
    def __call__(self, number: int, drawn: Sequence[Drawn]) -> RoundResult: ...


@dataclass
class Finding:
    """One distinct failure: the smallest case found (``case``; the drawn one when not
    shrunk), the shrink's result, and the failures it stands for."""

    case: Case
    signature: str
    failures: list[Failure]
    shrunk: Any = None  # search.shrink.ShrinkResult

    @property
    def first_s(self) -> float:
        return min(f.found_s for f in self.failures)


@dataclass(frozen=True)
class Progress:
    """After each round (``on_progress``): what the search did so far."""

    round: int
    cases: int
    failures: int
    elapsed_s: float
    run_id: int | None

    @property
    def cases_per_min(self) -> float:
        return 60.0 * self.cases / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        return (
            f"round {self.round}: {self.cases} cases, {self.failures} failed, "
            f"{self.elapsed_s:.0f}s, {self.cases_per_min:.1f} cases/min"
            + (f" (run {self.run_id})" if self.run_id is not None else "")
        )


@dataclass
class ExploreReport:
    """What a search did and found; ``exit_code`` 1 when it found a failure, else 0."""

    seed: int
    budget_s: float
    rounds: int = 0
    cases: int = 0
    elapsed_s: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)

    @property
    def first_failure_s(self) -> float | None:
        return min((f.found_s for f in self.failures), default=None)

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


class _Cost:
    """Seconds a case is expected to cost: a fixed part plus a part per element, fitted to
    the rounds so far (one rate for the whole search: crude, but it only sizes rounds)."""

    def __init__(self) -> None:
        self.fixed, self.rate = 0.2, 2e-6  # the tiled kernel on a CPU core, fwd_bwd
        self.seconds = self.elements = self.count = 0.0

    def __call__(self, case: Case) -> float:
        return self.fixed + self.rate * case_elements(case)

    def learn(self, cases: Sequence[Case], seconds: float) -> None:
        self.seconds += seconds
        self.elements += sum(case_elements(c) for c in cases)
        self.count += len(cases)
        extra = self.seconds - self.fixed * self.count
        if extra > 0 and self.elements > 0:
            self.rate = extra / self.elements


def explore(
    space: CaseSpace,
    run_round: RoundRunner,
    settings: ExploreSettings,
    *,
    shrink: Callable[[Case], Any] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> ExploreReport:
    """Search ``space`` in rounds until the budget is spent (or ``max_failures``), then shrink
    and merge what failed. ``shrink(case)`` returns a ``ShrinkResult`` (or None: not shrunk)."""
    report = ExploreReport(settings.seed, settings.budget_s)
    stream = space.cases(settings.seed)
    cost = _Cost()
    start = time.perf_counter()
    pending: Drawn | None = None
    while time.perf_counter() - start < settings.budget_s:
        left = settings.budget_s - (time.perf_counter() - start)
        target = min(settings.round_s, max(left, 1.0))
        drawn: list[Drawn] = []
        planned = 0.0
        while len(drawn) < settings.max_round_cases and (not drawn or planned < target):
            item = pending or next(stream)
            pending = None
            if drawn and planned + cost(item.case) > target * 1.5:
                pending = item  # the next round's first case: the stream stays the seed's
                break
            drawn.append(item)
            planned += cost(item.case)
        report.rounds += 1
        result = run_round(report.rounds, drawn)
        cost.learn([d.case for d in drawn], result.seconds)
        elapsed = time.perf_counter() - start
        report.cases += len(drawn)
        if result.run_id is not None:
            report.run_ids.append(result.run_id)
        for d in drawn:
            signature = result.failures.get(d.case.id)
            if signature is not None:
                report.failures.append(
                    Failure(d.case, signature, elapsed, report.rounds, result.run_id)
                )
        if on_progress is not None:
            on_progress(
                Progress(report.rounds, report.cases, len(report.failures), elapsed, result.run_id)
            )
        signatures = {f.signature for f in report.failures}
        if settings.max_failures is not None and len(signatures) >= settings.max_failures:
            break
    report.elapsed_s = time.perf_counter() - start
    report.findings = _findings(report.failures, shrink, settings.shrink_limit)
    return report


def _shrink_order(failures: Sequence[Failure]) -> list[Failure]:
    """The first failure of each signature (smallest case first), then the others."""
    ordered = sorted(failures, key=lambda f: (case_elements(f.case), f.found_s))
    firsts: dict[str, Failure] = {}
    for f in ordered:
        firsts.setdefault(f.signature, f)
    chosen = list(firsts.values())
    return chosen + [f for f in ordered if f not in chosen]


def _identity(case: Case) -> str:
    """A shrunk case's identity across suites (the drawn case's suite is an accident)."""
    data = case.canonical()
    data.pop("suite", None)
    return repr(sorted(data.items()))


def _findings(
    failures: Sequence[Failure], shrink: Callable[[Case], Any] | None, limit: int
) -> list[Finding]:
    findings: dict[str, Finding] = {}
    by_signature: dict[str, Finding] = {}
    unshrunk: list[Failure] = []
    for i, failure in enumerate(_shrink_order(failures)):
        result = shrink(failure.case) if shrink is not None and i < limit else None
        if result is None:
            unshrunk.append(failure)
            continue
        key = _identity(result.case)
        if key in findings:
            findings[key].failures.append(failure)
            continue
        finding = Finding(result.case, failure.signature, [failure], result)
        findings[key] = finding
        by_signature.setdefault(failure.signature, finding)
    for failure in unshrunk:
        known = by_signature.get(failure.signature)
        if known is not None:
            known.failures.append(failure)
            continue
        finding = Finding(failure.case, failure.signature, [failure])
        findings[_identity(failure.case)] = finding
        by_signature[failure.signature] = finding
    return sorted(findings.values(), key=lambda f: f.first_s)


def findings_matrix(report: ExploreReport, kernel: str, name: str) -> str:
    """The findings as a matrix file (one suite per op, one include entry per finding, each
    case explicit), for ``convmatrix run --matrix FILE`` and for nightly."""
    entries = [case_entry(f.case) for f in report.findings]
    suites = [f.case.suite for f in report.findings]
    lines = [
        f"# convmatrix explore --kernel {kernel} --seed {report.seed}: "
        f"{len(report.findings)} distinct failure(s) in {report.cases} cases, "
        f"{report.elapsed_s:.0f}s",
    ]
    for i, f in enumerate(report.findings, 1):
        how = "shrunk" if f.shrunk is not None else "as drawn (not shrunk)"
        lines.append(
            f"# {i}. {f.case.pytest_id}: {f.signature}; {how}; stands for "
            f"{len(f.failures)} failing case(s), first at {f.first_s:.0f}s"
        )
    text = matrix_text(
        entries,
        name,
        description=f"failures convmatrix explore found on {kernel}",
        suites=suites,
        timeout_s=_timeout(report),
    )
    return "\n".join(lines) + "\n" + text


def _timeout(report: ExploreReport) -> float | None:
    big = max((case_elements(f.case) for f in report.findings), default=0)
    return 900.0 if big > 1 << 22 else None
