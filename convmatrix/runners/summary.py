"""The short text a run ends with: counts by outcome, the worst failures, the run id.

Printed by the pytest plugin's terminal summary, which ``convmatrix run`` shows as its own;
failure lines come from the one verdict builder (``convmatrix.runners.verdict.describe``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from convmatrix.runners.results import OUTCOMES, CaseResult
from convmatrix.runners.verdict import describe, severity

__all__ = ["BAD_OUTCOMES", "counts_line", "summary_lines", "worst_failures"]

BAD_OUTCOMES = ("failed", "crashed", "timeout", "error")


def counts_line(counts: Mapping[str, int]) -> str:
    """``12 passed, 1 failed, 3 skipped`` in the fixed outcome order, zeros left out."""
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
    return ", ".join(parts) or "no results"


def worst_failures(results: Iterable[CaseResult], limit: int = 5) -> list[CaseResult]:
    bad = [r for r in results if r.outcome in BAD_OUTCOMES]
    return sorted(bad, key=severity, reverse=True)[:limit]


def summary_lines(
    results: Iterable[CaseResult],
    *,
    run_id: int | None,
    status: str | None,
    run_counts: Mapping[str, int] | None = None,
    where: str | None = None,
    crashed_workers: int = 0,
    limit: int = 5,
) -> list[str]:
    """Lines for the end of a run. ``run_counts`` (from the database) include the results of
    earlier sessions of a resumed run; without them the session's own counts are shown."""
    results = list(results)
    session = Counter(r.outcome for r in results)
    counts = run_counts if run_counts is not None else session
    lines = []
    worst = worst_failures(results, limit)
    if worst:
        lines.append(f"worst {len(worst)} of {sum(session[o] for o in BAD_OUTCOMES)} failures:")
        for result in worst:
            lines += ["  " + line for line in describe(result)]
    if crashed_workers:
        lines.append(f"{crashed_workers} worker(s) died and were replaced")
    name = "run (not recorded)" if run_id is None else f"run {run_id}"
    state = f" [{status}]" if status else ""
    lines.append(f"convmatrix {name}{state}: {counts_line(counts)}")
    if run_counts is not None and sum(run_counts.values()) != len(results):
        lines.append(f"  this session: {counts_line(session)}")
    if where:
        lines.append(f"  results in {where}")
    return lines
