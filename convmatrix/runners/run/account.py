"""The account of a finished run: counts by outcome, the worst failures, the exit status.

``Controller.finish`` builds one ``RunAccount`` per run; ``convmatrix.run`` returns it, the
pytest plugin prints it, and the exit status is computed from it (``exit_code``), never read
from anyone's state. Failure lines come from the one verdict builder
(``convmatrix.core.verdict.describe``), ordered by ``case_severity`` like the run report.

**No judgement, no pass.** A case is *judged* when the kernel gave a verdict on it:
``passed`` and ``failed`` (an expected-error case raised cleanly or did not) and ``crashed``
(the kernel killed its process: a verdict on the kernel, the one a segfaulting commit must
get in ``bisect``). ``skipped`` (the kernel is unavailable here or lacks a feature),
``timeout`` (a busy host can push any case past its limit), ``error`` (the harness raised)
and ``lost`` (the infrastructure lost the result) are not. A run that judged none of its
planned cases, or fewer than ``--min-judged`` of them (``DEFAULT_MIN_JUDGED``), ends with
exit status 4 (``core.errors.NotJudgedError``) unless a judged case failed (1): an
unloadable kernel skips every case and must not look green, nor good to ``git bisect``.
With ``--confirm``, the cases the machine failed to judge that the confirmation rerun judged
(at its longer limit) count as judged: a run of one case that timed out on a busy host and
passed on rerun is judged, not "nothing judged" (``rejudged``, set by ``pipeline.confirm``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from convmatrix.core.errors import InfrastructureError, NotJudgedError
from convmatrix.core.records import BAD_OUTCOMES, JUDGED, OUTCOMES, CaseResult
from convmatrix.core.sanitise import terminal_safe
from convmatrix.core.verdict import case_severity, describe

__all__ = [
    "DEFAULT_MIN_JUDGED",
    "JUDGED",
    "JUDGED_BAD",
    "UNJUDGED_BAD",
    "RunAccount",
    "counts_line",
    "exit_status",
    "judgement",
    "skip_reasons",
    "worst_failures",
]

JUDGED_BAD = ("failed", "crashed")
# Bad outcomes without a verdict: what a confirmation rerun (``--confirm``) may yet judge.
UNJUDGED_BAD = ("timeout", "error", "lost")
# The share of planned cases a run must judge. Low on purpose: a kernel's declared gaps
# are skips (fla lacks ~5% of nightly, a forward-only vLLM-style kernel ~70% of smoke, which
# judges 29%); what this catches is a run that judged (almost) nothing. Raise it where the
# kernel covers the whole matrix (--min-judged 0.9).
DEFAULT_MIN_JUDGED = 0.2


def counts_line(counts: Mapping[str, int]) -> str:
    """``12 passed, 1 failed, 3 skipped`` in the fixed outcome order, zeros left out."""
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
    return ", ".join(parts) or "no results"


def skip_reasons(results: Iterable[CaseResult]) -> dict[str, int]:
    """Why cases were skipped (their stored message) -> how many, most frequent first."""
    reasons = Counter(r.message or "(no reason given)" for r in results if r.outcome == "skipped")
    return dict(reasons.most_common())


def judgement(
    counts: Mapping[str, int],
    planned: int,
    min_judged: float = DEFAULT_MIN_JUDGED,
    reasons: Mapping[str, int] | None = None,
    rejudged: int = 0,
) -> str | None:
    """Why these counts are no judgement, in one line (``nothing judged: ...``), or None.
    ``planned``: the cases set out to be run (0: nothing to judge, nothing missing);
    ``reasons``: the skip reasons, the most frequent named; ``rejudged``: cases the machine
    failed to judge that a confirmation rerun judged (``RunAccount.rejudged``)."""
    if planned <= 0:
        return None
    judged = sum(counts.get(o, 0) for o in JUDGED) + rejudged
    needed = max(1, math.ceil(min_judged * planned - 1e-9))  # 0.2 * 35 is 7.000000000000001
    if judged >= needed:
        return None
    line = f"nothing judged: {judged} of {planned} planned cases judged, {needed} needed"
    line += f" (--min-judged {min_judged:g})"
    if reasons:
        reason, n = next(iter(reasons.items()))
        line += f"; {n} skipped: {reason}"
    unjudged = [f"{counts[o]} {o}" for o in UNJUDGED_BAD if counts.get(o)]
    if unjudged:
        line += f"; {', '.join(unjudged)}"
    return line


def exit_status(account: RunAccount, fail_on: Iterable[str] = (), raised: int = 0) -> int:
    """The run's exit status (``account.exit_code``); under ``--fail-on new-regressions`` a
    finished run fails (1) only when it ``raised`` a regression, so a failure already known
    passes CI. Infrastructure (3), nothing judged (4) and interrupted (130) stay as they are,
    and a run that stopped early is 1."""
    code = account.exit_code
    kept = (InfrastructureError.exit_code, NotJudgedError.exit_code, 130)
    if "new-regressions" not in fail_on or code in kept:
        return code
    return 1 if account.status != "finished" or raised else 0


def worst_failures(results: Iterable[CaseResult], limit: int = 5) -> list[CaseResult]:
    bad = [r for r in results if r.outcome in BAD_OUTCOMES]
    return sorted(bad, key=case_severity, reverse=True)[:limit]


@dataclass
class RunAccount:
    """One run as it ended. ``counts`` are the run's (a resumed run's earlier sessions
    included, when a store keeps them); ``session`` this session's own."""

    run_id: int | None
    status: str  # finished | interrupted
    counts: dict[str, int]
    session: dict[str, int]
    planned: int  # cases this session set out to run
    worst: list[CaseResult] = field(default_factory=list)  # this session's, worst first
    where: str | None = None  # where the results are (database URL, password redacted)
    crashed_workers: int = 0
    signalled: bool = False  # stopped by SIGINT / SIGTERM
    retried: int = 0  # cases resubmitted (a lost actor or node, a crash confirmed elsewhere)
    shard: str | None = None  # "I/N" when this session ran one shard of the run
    # The database or the executor failed under the run (one line: what, and where the
    # results are instead): the run is ``interrupted`` and exits with INFRASTRUCTURE_EXIT.
    infrastructure: str | None = None
    min_judged: float = DEFAULT_MIN_JUDGED  # --min-judged
    skipped: dict[str, int] = field(default_factory=dict)  # this session's skip reasons
    # A shard's: the whole run's status once this shard closed (running until the last).
    run_status: str | None = None
    missing_shards: list[str] = field(default_factory=list)  # of a sharded run, read back
    # Cases the machine failed to judge (a timeout under load) that the ``--confirm`` rerun
    # judged, at its longer limit: they count as judged (pipeline.confirm sets it).
    rejudged: int = 0

    @property
    def own(self) -> dict[str, int]:
        """The counts this account answers for: a shard's own cases (the others may still be
        running), else the run's."""
        return self.session if self.shard else self.counts

    @property
    def passed(self) -> bool:
        """Every case of the run passed or was skipped, and the run is complete."""
        return self.status == "finished" and not any(self.own.get(o) for o in BAD_OUTCOMES)

    @property
    def not_judged(self) -> str | None:
        """One line when the run judged too little to pass (``judgement``), else None."""
        own = self.own
        planned = max(self.planned, sum(own.values()))  # a resumed run: every session's
        return judgement(own, planned, self.min_judged, self.skipped, self.rejudged)

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 a judged case failed or the run stopped early, 3 the database or
        the executor failed under it, 4 nothing judged, 130 stopped by a signal
        (``core.errors.EXIT_CODES``)."""
        if self.signalled:
            return 130
        if self.infrastructure:
            return InfrastructureError.exit_code
        if any(self.own.get(o) for o in JUDGED_BAD):
            return 1
        if self.not_judged:
            return NotJudgedError.exit_code
        return 0 if self.passed else 1

    def lines(self) -> list[str]:
        """The text a run ends with."""
        lines = []
        if self.worst:
            n_bad = sum(self.session.get(o, 0) for o in BAD_OUTCOMES)
            lines.append(f"worst {len(self.worst)} of {n_bad} failures:")
            for result in self.worst:  # kernel text: escape sequences shown, not obeyed
                lines += ["  " + terminal_safe(line) for line in describe(result)]
        if self.crashed_workers:
            lines.append(f"{self.crashed_workers} worker(s) died and were replaced")
        if self.retried:
            lines.append(f"{self.retried} case(s) retried (reasons in the report)")
        name = "run (not recorded)" if self.run_id is None else f"run {self.run_id}"
        state = f" [{self.status}]" if self.status else ""
        if self.shard:  # its own cases; the run is whole only once every shard reported
            lines.append(f"convmatrix shard {self.shard}{state} of {name}: "
                         f"{counts_line(self.session)}")  # fmt: skip
            whole = "" if self.run_status == "finished" else " so far"
            run_state = f" [{self.run_status}]" if self.run_status else ""
            lines.append(f"  {name}{run_state}{whole}: {counts_line(self.counts)}")
        else:
            lines.append(f"convmatrix {name}{state}: {counts_line(self.counts)}")
            if sum(self.counts.values()) != sum(self.session.values()):
                lines.append(f"  this session: {counts_line(self.session)}")
        for reason, n in list(self.skipped.items())[:3]:
            lines.append(f"  skipped {n}: {terminal_safe(reason)}")
        if len(self.skipped) > 3:
            lines.append(f"  skipped for {len(self.skipped) - 3} other reason(s): see the report")
        missing = self.planned - sum(self.session.values())
        if self.missing_shards:
            lines.append(f"  shard(s) missing: {', '.join(self.missing_shards)}")
        elif missing > 0:
            again = "" if self.run_id is None else f": convmatrix run --resume {self.run_id}"
            lines.append(f"  {missing} of {self.planned} planned cases not run{again}")
        if self.where:
            lines.append(f"  results in {self.where}")
        if self.infrastructure:
            lines.append(f"  infrastructure failure: {self.infrastructure}")
        elif self.not_judged and self.exit_code == NotJudgedError.exit_code:
            lines.append(terminal_safe(self.not_judged))
        return lines
