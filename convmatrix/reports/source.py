"""Where reports get their data: opening the database to read, and the few queries of their
own (the previous run of a kernel, per-run case counts of one dtype).

Everything else comes from ``convmatrix.db`` (``resolve_run``, ``load_results``, ``history``);
the database itself is opened by ``db.database.Database``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from convmatrix.core.errors import UsageError
from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.db import (
    RunInfo,
    case_counts,
    load_results,
    missing_shards,
    resolve_run,
)
from convmatrix.db.lineage import lineage_runs
from convmatrix.reports.viewmodel import RunHeader, run_header

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = [
    "LoadedRun",
    "earlier_runs",
    "find_run",
    "load_run",
    "previous_run",
    "run_case_counts",
]


@dataclass
class LoadedRun:
    info: RunInfo  # the database's record of the run
    header: RunHeader  # what reports show of it (counted from ``results``, URL redacted)
    results: list[CaseResult]


def find_run(session: Reader, spec: str, *, what: str = "RUN") -> RunInfo:
    """The run ``spec`` names (id, ``latest``, label or commit); errors start with ``what``."""
    try:
        return resolve_run(session, spec)
    except UsageError as err:
        raise type(err)(f"{what}: {err}") from None  # malformed (InputError) stays malformed


def load_run(
    session: Reader, spec: str, url: str, *, what: str = "RUN", info: RunInfo | None = None
) -> LoadedRun:
    """The run ``spec`` names (or ``info``, found before) with every stored result."""
    info = info or find_run(session, spec, what=what)
    results = load_results(session, info.id)
    missing = missing_shards(session, info.id, info.shard_count)
    header = run_header(info, url, results, missing)
    return LoadedRun(info=info, header=header, results=results)


def previous_run(session: Reader, run: RunInfo) -> RunInfo | None:
    """The newest plain run before ``run`` of the same kernel, matrix and device kind: what a
    nightly diff compares against. Uses the (kernel, started_at) index."""
    found = earlier_runs(session, run, 1)
    return found[0] if found else None


def earlier_runs(session: Reader, run: RunInfo, limit: int) -> list[RunInfo]:
    """Up to ``limit`` plain runs before ``run`` of the same kernel, matrix and device kind,
    newest first (a run's baseline, the history a timing is judged against); confirm, bisect
    and adequacy runs are never a baseline, nor a run that judged nothing (a kernel that did
    not load: its skips would make the next real run's failures look new, or hide them)."""
    rows = lineage_runs(
        session, run.kernel, run.matrix, run.device_kind,
        before=run, judged=True, newest_first=True, limit=limit,
    )  # fmt: skip
    return [resolve_run(session, row.id) for row in rows]


def run_case_counts(
    session: Reader, dtype: str, run_ids: Sequence[int]
) -> dict[int, tuple[int, int, int]]:
    """run id -> (cases, passed, bad) among the run's cases with input dtype ``dtype``.

    Read from the per-run count summaries (live only for runs still writing)."""
    counts = case_counts(session, dtype, list(run_ids))
    return {
        run: (
            sum(c.values()),
            c.get("passed", 0),
            sum(n for outcome, n in c.items() if outcome in BAD_OUTCOMES),
        )
        for run, c in counts.items()
    }
