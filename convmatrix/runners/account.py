"""The account of a finished run: counts by outcome, the worst failures, the exit status.

``Controller.finish`` builds one ``RunAccount`` per run; ``convmatrix.run`` returns it, the
pytest plugin prints it, and the exit status is computed from it (``exit_code``), never read
from anyone's state. Failure lines come from the one verdict builder
(``convmatrix.core.verdict.describe``), ordered by ``case_severity`` like the run report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from convmatrix.core.errors import InfrastructureError
from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, CaseResult
from convmatrix.core.sanitise import terminal_safe
from convmatrix.core.verdict import case_severity, describe

__all__ = ["RunAccount", "counts_line", "worst_failures"]


def counts_line(counts: Mapping[str, int]) -> str:
    """``12 passed, 1 failed, 3 skipped`` in the fixed outcome order, zeros left out."""
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
    return ", ".join(parts) or "no results"


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

    @property
    def passed(self) -> bool:
        """Every case of the run passed or was skipped, and the run is complete."""
        # A shard answers for its own cases: the others may still be running.
        counts = self.session if self.shard else self.counts
        return self.status == "finished" and not any(counts.get(o) for o in BAD_OUTCOMES)

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 any failed or the run stopped early, 3 the database or the
        executor failed under it, 130 stopped by a signal (``core.errors.EXIT_CODES``)."""
        if self.signalled:
            return 130
        if self.infrastructure:
            return InfrastructureError.exit_code
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
        if self.shard:
            name = f"shard {self.shard} of {name}"
        state = f" [{self.status}]" if self.status else ""
        lines.append(f"convmatrix {name}{state}: {counts_line(self.counts)}")
        if sum(self.counts.values()) != sum(self.session.values()):
            lines.append(f"  this session: {counts_line(self.session)}")
        missing = self.planned - sum(self.session.values())
        if missing > 0:
            again = "" if self.run_id is None else f": convmatrix run --resume {self.run_id}"
            lines.append(f"  {missing} of {self.planned} planned cases not run{again}")
        if self.where:
            lines.append(f"  results in {self.where}")
        if self.infrastructure:
            lines.append(f"  infrastructure failure: {self.infrastructure}")
        return lines
