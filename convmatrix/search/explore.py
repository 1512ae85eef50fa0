"""A budgeted search for what the matrix misses: drawn cases in rounds, failures shrunk.

``explore`` draws cases from the whole space (``search.space``), runs them in rounds through
a ``RoundRunner`` (the pipeline's: every round is a recorded run of the same executors as
``convmatrix run``), and stops when the budget is spent or ``max_failures`` distinct failures
were found. Each round is sized by what the cases before it cost (about ``round_s``); a round
of many cases amortises the executor's start-up (xdist workers import torch). The budget bounds
the rounds too: no round starts past it, and the runner is told what is left of it, which
limits every case of the round (a hanging kernel) and cuts the round at its end.

A search ends early, keeping what it found, on a signal (``KeyboardInterrupt``: nothing more
is run or shrunk) and on an ``InfrastructureError`` (the executor or the database failed under
it); the report says which (``interrupted``, ``fault``) and its exit status follows.

Then each failure is shrunk (``shrink``: the shrink helper's greedy delta debugging, each
candidate a real case) and failures whose shrunk cases agree are merged into one
``ExploredFailure``: one bug seen from many cases is one line of the matrix it writes. Shrinking is
bounded three times: each failure by ``shrink_runs`` case runs, the failures shrunk by
``shrink_limit``, taken first-of-each-signature first (a kernel that fails every case would
otherwise spend hours shrinking the same bug), and all of it by the budget: once a failure
is found the search stops at ``1 - SHRINK_SHARE`` of the budget, and the shrinking gets what
is left (a shrink cut by it keeps the smallest case so far); a failure not shrunk joins the
finding of its signature. The findings are written as a matrix (``findings_matrix``) that
``convmatrix run --matrix FILE`` runs for nightly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from convmatrix.core.case import Case
from convmatrix.core.errors import InfrastructureError, NotJudgedError
from convmatrix.matrix.build import case_elements
from convmatrix.search.space import CaseSpace, Drawn, case_entry, matrix_text
from convmatrix.search.stop import BudgetSpent

__all__ = [
    "ExploreProgress",
    "ExploreReport",
    "ExploreSettings",
    "ExploredFailure",
    "Failure",
    "RoundResult",
    "RoundRunner",
    "explore",
    "findings_matrix",
]

SHRINK_SHARE = 0.25  # of the budget, kept for shrinking once a failure was found


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
    """What one round's run gave: its recorded run, per case id the failure signature of
    each case that failed (``search.probe.signature_of``), the case seconds, and the ids of
    the cases judged (``None``: every case drawn). ``cut``: the budget ran out during the
    round; ``interrupted``: a signal ended it (what was judged before either still counts)."""

    run_id: int | None
    failures: dict[str, str]
    seconds: float
    judged: frozenset[str] | None = None
    cut: bool = False
    interrupted: bool = False


class RoundRunner(Protocol):
    """Runs round ``number`` of ``drawn`` cases within ``left_s`` seconds (what is left of
    the budget: no case may run longer, and the round ends with it)."""

    def __call__(self, number: int, drawn: Sequence[Drawn], left_s: float) -> RoundResult: ...


@dataclass
class ExploredFailure:
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
class ExploreProgress:
    """After each round (``on_progress``): what the search did so far."""

    round: int
    cases: int
    failures: int
    elapsed_s: float
    run_id: int | None
    unjudged: int = 0  # cases of this round left unjudged (the budget ran out, a signal)

    @property
    def cases_per_min(self) -> float:
        return 60.0 * self.cases / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        return (
            f"round {self.round}: {self.cases} cases, {self.failures} failed, "
            f"{self.elapsed_s:.0f}s, {self.cases_per_min:.1f} cases/min"
            + (f" (run {self.run_id})" if self.run_id is not None else "")
            + (f"; cut: {self.unjudged} drawn case(s) not judged" if self.unjudged else "")
        )


@dataclass
class ExploreReport:
    """What a search did and found. ``cases`` counts the cases judged; ``cut`` says the
    budget ran out inside the last round, ``interrupted`` that a signal ended the search,
    ``fault`` what failed under it (the executor, the database)."""

    seed: int
    budget_s: float
    rounds: int = 0
    cases: int = 0
    elapsed_s: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    findings: list[ExploredFailure] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    cut: bool = False
    interrupted: bool = False
    signal: str | None = None  # the signal that ended it (SIGINT, SIGTERM), when one did
    fault: str | None = None

    @property
    def first_failure_s(self) -> float | None:
        return min((f.found_s for f in self.failures), default=None)

    @property
    def exit_code(self) -> int:
        """130 interrupted, 3 an infrastructure fault, 1 when a failure was found, 4 when no
        case got a verdict at all (a kernel that hangs on every call, cut at the budget's
        end in process: "found nothing" would be a green that judged nothing), else 0
        (``core.errors.EXIT_CODES``)."""
        if self.interrupted:
            return 130
        if self.fault is not None:
            return InfrastructureError.exit_code
        if self.failures:
            return 1
        return NotJudgedError.exit_code if self.cases == 0 else 0


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
    shrink: Callable[[Case, float], Any] | None = None,
    on_progress: Callable[[ExploreProgress], None] | None = None,
    on_round: Callable[[ExploreReport], None] | None = None,
) -> ExploreReport:
    """Search ``space`` in rounds within the budget (or until ``max_failures``), then shrink
    and merge what failed in what is left of it. ``shrink(case, seconds)`` returns a
    ``ShrinkResult`` within ``seconds`` (or None: not shrunk). ``on_round(report)`` after
    each round that found a failure, its findings as drawn (the pipeline writes them: a
    process killed later keeps them). A signal or an infrastructure fault ends the search
    with what it found, unshrunk."""
    report = ExploreReport(settings.seed, settings.budget_s)
    start = time.perf_counter()
    reserve = SHRINK_SHARE * settings.budget_s if shrink is not None else 0.0
    try:
        _search(space, run_round, settings, report, start, reserve, on_progress, on_round)
    except BudgetSpent:  # the budget's alarm outside a round's run: nothing was cut
        pass
    except KeyboardInterrupt:
        report.interrupted = True
    except InfrastructureError as exc:
        report.fault = str(exc)
    report.elapsed_s = time.perf_counter() - start
    stopped = report.interrupted or report.fault is not None
    deadline = start + settings.budget_s
    report.findings = _findings(report, None if stopped else shrink, settings.shrink_limit,
                                deadline)  # fmt: skip
    report.elapsed_s = time.perf_counter() - start
    return report


def _next_round(
    stream: Any, pending: Drawn | None, cost: _Cost, settings: ExploreSettings, left: float
) -> tuple[list[Drawn], Drawn | None]:
    """The next round's cases, planned to take about ``round_s`` (less near the budget's
    end), and the case drawn past it (the next round's first: the stream stays the seed's)."""
    target = min(settings.round_s, max(left, 1.0))
    drawn: list[Drawn] = []
    planned = 0.0
    while len(drawn) < settings.max_round_cases and (not drawn or planned < target):
        item = pending or next(stream)
        pending = None
        if drawn and planned + cost(item.case) > target * 1.5:
            return drawn, item
        drawn.append(item)
        planned += cost(item.case)
    return drawn, pending


def _search(
    space: CaseSpace,
    run_round: RoundRunner,
    settings: ExploreSettings,
    report: ExploreReport,
    start: float,
    reserve: float,
    on_progress: Callable[[ExploreProgress], None] | None,
    on_round: Callable[[ExploreReport], None] | None,
) -> None:
    """The rounds: none starts past the budget (less the shrinking's ``reserve`` once a
    failure was found); each is told the budget left."""
    stream = space.cases(settings.seed)
    cost = _Cost()
    pending: Drawn | None = None
    while True:
        left = settings.budget_s - (time.perf_counter() - start)
        if left <= (reserve if report.failures else 0.0):
            return
        drawn, pending = _next_round(stream, pending, cost, settings, left)
        report.rounds += 1
        result = run_round(report.rounds, drawn, left)
        judged = [d for d in drawn if result.judged is None or d.case.id in result.judged]
        cost.learn([d.case for d in judged], result.seconds)
        elapsed = time.perf_counter() - start
        report.cases += len(judged)
        if result.run_id is not None:
            report.run_ids.append(result.run_id)
        found = [d for d in judged if d.case.id in result.failures]
        for d in found:
            failure = Failure(d.case, result.failures[d.case.id], elapsed, report.rounds,
                              result.run_id)  # fmt: skip
            report.failures.append(failure)
        if on_progress is not None:
            on_progress(ExploreProgress(report.rounds, report.cases, len(report.failures), elapsed,
                                 result.run_id, len(drawn) - len(judged)))  # fmt: skip
        if found and on_round is not None:
            report.elapsed_s, report.findings = elapsed, _findings(report, None, 0)
            on_round(report)
        if result.cut or result.interrupted:
            report.cut = result.cut and len(judged) < len(drawn)  # a case was left unjudged
            report.interrupted = result.interrupted
            return
        signatures = {f.signature for f in report.failures}
        if settings.max_failures is not None and len(signatures) >= settings.max_failures:
            return


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


def _shrunk(
    report: ExploreReport, shrink: Callable[[Case, float], Any], case: Case, deadline: float
) -> Any:
    """``case`` shrunk within the time left, or None (no time left, or stopped before its
    failure was reproduced). A signal marks the report ``interrupted``."""
    left = deadline - time.perf_counter()
    if left <= 0 or report.interrupted:
        return None
    try:
        result = shrink(case, left)
    except BudgetSpent:
        return None
    except KeyboardInterrupt:
        report.interrupted = True
        return None
    report.interrupted = report.interrupted or bool(getattr(result, "interrupted", False))
    return result


def _findings(
    report: ExploreReport,
    shrink: Callable[[Case, float], Any] | None,
    limit: int,
    deadline: float = math.inf,
) -> list[ExploredFailure]:
    """The failures merged into findings, the first ``limit`` shrunk first, until
    ``deadline`` (``time.perf_counter``). A signal while shrinking stops the shrinking (the
    report is ``interrupted``); the rest stay as drawn."""
    findings: dict[str, ExploredFailure] = {}
    by_signature: dict[str, ExploredFailure] = {}
    unshrunk: list[Failure] = []
    for i, failure in enumerate(_shrink_order(report.failures)):
        result = None
        if shrink is not None and i < limit:
            result = _shrunk(report, shrink, failure.case, deadline)
        if result is None:
            unshrunk.append(failure)
            continue
        key = _identity(result.case)
        if key in findings:
            findings[key].failures.append(failure)
            continue
        finding = ExploredFailure(result.case, failure.signature, [failure], result)
        findings[key] = finding
        by_signature.setdefault(failure.signature, finding)
    for failure in unshrunk:
        known = by_signature.get(failure.signature)
        if known is not None:
            known.failures.append(failure)
            continue
        finding = ExploredFailure(failure.case, failure.signature, [failure])
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
        f"{report.elapsed_s:.0f}s" + _ending(report),
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


def _ending(report: ExploreReport) -> str:
    """How the search ended, when it ended early (the findings are those found so far)."""
    if report.interrupted:
        return " (interrupted: the findings so far)"
    if report.fault is not None:
        return f" (stopped by an infrastructure failure: {' '.join(report.fault.split())})"
    return ""


def _timeout(report: ExploreReport) -> float | None:
    big = max((case_elements(f.case) for f in report.findings), default=0)
    return 900.0 if big > 1 << 22 else None
