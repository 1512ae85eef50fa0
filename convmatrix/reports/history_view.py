"""How one dtype's errors moved over time: one entry per run, oldest first.

The numbers come from the database (``convmatrix.db.history``: worst and median bound usage,
e_rel and e_norm per run and output, computed with GROUP BY and window functions; the charts
draw the usage against the verdict's safety factor), plus one small GROUP BY
over cases for each run's case count and pass rate at that dtype. Nothing here scans metric
rows in Python; this module only arranges the aggregates for tables, CSV, JSON and charts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from convmatrix.core.bounds import DEFAULT_SAFETY
from convmatrix.core.dtypes import parse_case_dtype
from convmatrix.core.errors import InputError
from convmatrix.core.tolerances import OUTPUTS
from convmatrix.db.engine import redact_url
from convmatrix.db.queries import HistoryPoint, OutputStats, history, run_values
from convmatrix.reports.source import run_case_counts

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = [
    "HistoryRun",
    "HistoryView",
    "build_history_view",
    "flat_rows",
    "load_history",
    "parse_since",
]


@dataclass
class HistoryRun:
    """One run: an x position of the charts, labelled by its kernel and commit."""

    run_id: int
    started_at: str
    kernel: str
    commit: str | None
    label: str | None
    device: str
    matrix: str
    cases: int  # cases of this dtype in the run
    passed: int
    bad: int  # failed, crashed, timeout or error
    outputs: dict[str, OutputStats] = field(default_factory=dict)
    pass_rate: float | None = None  # passed / (passed + bad); None when nothing was judged
    failing: bool = False  # a bad case, or an output that failed its limits
    tag: str = ""  # the x label: kernel @ short commit, else kernel and label, else run N

    @property
    def lineage(self) -> str:
        """The runs one line of a chart joins: one kernel on one matrix and device kind (two
        kernels' errors on one line would read as one kernel changing)."""
        return f"{self.kernel} / {self.matrix} / {self.device}"

    def finish(self) -> None:
        """Fill the derived fields once every output is in."""
        judged = self.passed + self.bad
        self.pass_rate = self.passed / judged if judged else None
        self.failing = self.bad > 0 or any(s.passed < s.cases for s in self.outputs.values())
        where = f"@{self.commit[:8]}" if self.commit else f" {self.label or f'run {self.run_id}'}"
        self.tag = f"{self.kernel}{where}"


@dataclass
class HistoryView:
    kind: str
    dtype: str
    output: str | None
    kernel: str | None
    since: str | None
    database: str
    outputs: list[str]
    runs: list[HistoryRun]
    safety: float = DEFAULT_SAFETY  # the usage the default policy allows: the charts' line
    matrix: str | None = None
    choices: dict[str, list[str]] = field(default_factory=dict)  # filter -> values held

    @property
    def lineages(self) -> list[str]:
        """The lineages of the runs shown (``HistoryRun.lineage``), in order of first run."""
        return list(dict.fromkeys(run.lineage for run in self.runs))


def parse_since(text: str | None) -> datetime | None:
    """``--since``: an ISO date or date-time (UTC if no zone), or ``N`` days back as ``30d``."""
    if text is None:
        return None
    if m := re.fullmatch(r"(\d+)d", text.strip()):
        try:
            return datetime.now(timezone.utc) - timedelta(days=int(m.group(1)))
        except (OverflowError, ValueError):  # before the year 1: no date holds it
            raise InputError(
                f"--since {text.strip()[:40]!r}: more days than a date can go back"
            ) from None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(
            f"--since {text!r}: expected a date such as 2025-01-31, a date-time such as "
            "2025-01-31T12:00, or a number of days such as 30d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def load_history(
    session: Reader,
    url: str,
    dtype: str,
    *,
    output: str | None = None,
    kernel: str | None = None,
    since: str | None = None,
    matrix: str | None = None,
) -> HistoryView:
    """The history of input dtype ``dtype`` (any spelling: ``bf16``, ``BF16``, ``bfloat16``):
    what ``convmatrix history`` prints and ``/history/{dtype}`` serves, from one builder."""
    dtype = parse_case_dtype(dtype)
    if output is not None and output not in OUTPUTS:
        raise InputError(f"--output {output!r}: choose from {', '.join(OUTPUTS)}")
    moment = parse_since(since)
    points = history(session, dtype, kernel=kernel, since=moment, output=output, matrix=matrix)
    counts = run_case_counts(session, dtype, sorted({p.run_id for p in points}))
    view = build_history_view(
        points, counts, dtype=dtype, database=redact_url(url), output=output, kernel=kernel,
        since=moment, matrix=matrix,
    )  # fmt: skip
    view.choices = run_values(session, {"kernel": "kernel", "matrix": "matrix"}, kind="run")
    view.choices["output"] = list(OUTPUTS)
    return view


def build_history_view(
    points: Sequence[HistoryPoint],
    counts: Mapping[int, tuple[int, int, int]],
    *,
    dtype: str,
    database: str,
    output: str | None = None,
    kernel: str | None = None,
    since: datetime | None = None,
    matrix: str | None = None,
) -> HistoryView:
    """Group the per-(run, output) points by run, keeping the database's order (by time)."""
    runs: dict[int, HistoryRun] = {}
    outputs: list[str] = []
    for p in points:
        run = runs.get(p.run_id)
        if run is None:
            cases, passed, bad = counts.get(p.run_id, (0, 0, 0))
            run = runs[p.run_id] = HistoryRun(
                run_id=p.run_id,
                started_at=p.started_at.isoformat(timespec="seconds"),
                kernel=p.kernel,
                commit=p.kernel_commit,
                label=p.label,
                device=p.device_kind,
                matrix=p.matrix,
                cases=cases,
                passed=passed,
                bad=bad,
            )
        run.outputs[p.output] = p.stats
        if p.output not in outputs:
            outputs.append(p.output)
    for run in runs.values():
        run.finish()
    return HistoryView(
        kind="history",
        dtype=dtype,
        output=output,
        kernel=kernel,
        since=since.isoformat(timespec="seconds") if since else None,
        database=database,
        outputs=outputs,
        runs=list(runs.values()),
        matrix=matrix,
    )


FLAT_COLUMNS = (
    "run_id", "started_at", "kernel", "matrix", "commit", "label", "run_cases", "run_pass_rate",
    "output", "cases", "passed", "worst_usage", "median_usage", "worst_rel", "median_rel",
    "worst_norm", "median_norm",
)  # fmt: skip


def flat_rows(view: HistoryView) -> list[dict[str, Any]]:
    """One row per (run, output), columns ``FLAT_COLUMNS``: for the table and CSV formats."""
    rows = []
    for run in view.runs:
        for output, s in run.outputs.items():
            rows.append(
                {
                    "run_id": run.run_id,
                    "started_at": run.started_at,
                    "kernel": run.kernel,
                    "matrix": run.matrix,
                    "commit": run.commit or "",
                    "label": run.label or "",
                    "run_cases": run.cases,
                    "run_pass_rate": run.pass_rate,
                    "output": output,
                    "cases": s.cases,
                    "passed": s.passed,
                    "worst_usage": s.worst_usage,
                    "median_usage": s.median_usage,
                    "worst_rel": s.worst_rel,
                    "median_rel": s.median_rel,
                    "worst_norm": s.worst_norm,
                    "median_norm": s.median_norm,
                }
            )
    return rows
