"""What every report shares: the run header, error arithmetic with NaN, JSON export.

Reports are built in two steps (asv's publish): the database becomes plain dataclasses (the
view-model), and templates only format them. The same view-model is written as JSON next to
the HTML, so tests and scripts read numbers from data, never from markup.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from convmatrix.core.errors import UsageError
from convmatrix.core.recorded import Recorded
from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, CaseResult
from convmatrix.db.engine import redact_url
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.account import JUDGED_BAD, judgement

__all__ = [
    "RunHeader",
    "json_text",
    "out_dir",
    "run_header",
    "to_jsonable",
    "write_pages",
]


@dataclass
class RunHeader:
    """The header of a report: which kernel, commit, device, versions and matrix, and counts."""

    id: int
    kernel: str
    commit: str | None
    dirty: bool | None
    device: str
    host: str
    matrix: str
    matrix_hash: str
    label: str | None
    started_at: str
    finished_at: str | None
    status: str
    versions: dict[str, Any]
    geometry: dict[str, Any] | None
    database: str  # the URL with its password redacted
    # the options that rerun its cases (RunOptions.rerun: its matrix file, kernel spec, device
    # kind, --policy rule, reference device...), recorded form: for rerun commands and bisect
    rerun: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # outcome -> cases, from the results
    n_cases: int = 0
    n_planned: int | None = None
    shard_count: int | None = None  # a run written by CI shards
    shards_missing: list[str] = field(default_factory=list)  # "2/4 never started", ...
    retried: int = 0  # cases resubmitted (lost actor or node, crash confirmed elsewhere)
    lost: int = 0  # cases given up after repeated lost nodes (outcome ``lost``, "lost node")
    # the kernel's declared arithmetic as the run recorded it (None: recorded none); the
    # bound, so the usage, follows it
    arithmetic: dict[str, Any] | None = None

    @property
    def title(self) -> str:
        """``tiled @ 1a2b3c4 (run 7)``: how a run is named in headings and charts."""
        commit = f" @ {self.commit[:10]}" if self.commit else ""
        return f"{self.kernel}{commit} (run {self.id})"

    @property
    def passed(self) -> bool:
        """No case failed, crashed, timed out or errored (skips allowed)."""
        return not any(self.counts.get(o, 0) for o in BAD_OUTCOMES)

    @property
    def complete(self) -> bool:
        """The run finished, holds a result for every case it planned, and (sharded) every
        shard reported."""
        planned = self.n_planned if self.n_planned is not None else self.n_cases
        done = self.status == "finished" and self.n_cases >= planned
        return done and not self.shards_missing

    @property
    def verdict(self) -> str:
        """PASSED, FAILED, NOTHING JUDGED (too few cases got a verdict:
        ``runners.run.account.judgement`` at its default share) or INCOMPLETE (nothing failed, but
        the run stopped or is running): CI must not read a run killed half-way, or one that
        skipped every case, as a pass. In the order of the exit statuses (1, 4, 1)."""
        if any(self.counts.get(o, 0) for o in JUDGED_BAD):
            return "FAILED"
        planned = max(self.n_planned or 0, self.n_cases)
        if judgement(self.counts, planned) is not None:
            return "NOTHING JUDGED"
        if not self.passed:
            return "FAILED"
        return "PASSED" if self.complete else "INCOMPLETE"


def shard_lines(run: RunHeader) -> list[str]:
    """What a person must know about shards and retries of a run, as text lines."""
    lines = []
    if run.shards_missing:
        lines.append(f"incomplete: shard(s) missing: {', '.join(run.shards_missing)}")
    if run.retried or run.lost:
        lost = f", {run.lost} lost (lost node)" if run.lost else ""
        lines.append(f"{run.retried} case(s) retried{lost}")
    return lines


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def run_header(
    run: Any, url: str, results: Iterable[CaseResult] = (), shards_missing: Iterable[str] = ()
) -> RunHeader:
    """The header of ``run`` (a ``convmatrix.db`` Run row), counted from ``results``.

    Counts come from the results the report shows rather than the run's own counters, so a
    report of an interrupted run still adds up. ``url`` is redacted: no credentials in reports.
    """
    counts = dict.fromkeys(OUTCOMES, 0)
    n = retried = lost = 0
    for result in results:
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
        n += 1
        retried += bool(getattr(result, "retries", 0))
        lost += result.outcome == "lost" and (result.message or "").startswith("lost node")
    device = run.device_kind + (f" ({run.device_name})" if run.device_name else "")
    options = getattr(run, "options", None) or {}
    rerun = RunOptions.rerun(options, run.matrix, run.kernel, device=run.device_kind)
    return RunHeader(
        id=run.id,
        kernel=run.kernel,
        commit=run.kernel_commit,
        dirty=run.kernel_dirty,
        device=device,
        host=run.host,
        matrix=run.matrix,
        matrix_hash=run.matrix_hash,
        label=run.label,
        started_at=_iso(run.started_at) or "",
        finished_at=_iso(run.finished_at),
        # a running run whose controller is gone shows as abandoned
        status=getattr(run, "shown_status", run.status),
        versions=dict(run.versions or {}),
        geometry=dict(run.geometry) if run.geometry else None,
        database=redact_url(url),
        rerun=rerun.recorded(),
        arithmetic=Recorded.of(options).arithmetic,
        counts=counts,
        n_cases=n,
        n_planned=run.n_planned,
        shard_count=getattr(run, "shard_count", None),
        shards_missing=list(shards_missing),
        retried=retried,
        lost=lost,
    )


def to_jsonable(value: Any) -> Any:
    """Dataclasses, mappings and sequences as JSON data; NaN and infinities as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": strict JSON has no such numbers
    return value


def json_text(view: Any) -> str:
    """The view-model as strict JSON (``allow_nan=False``): the file beside a report."""
    return json.dumps(to_jsonable(view), indent=1, allow_nan=False) + "\n"


def write_pages(html_path: Path, html: str, data: str) -> tuple[Path, Path]:
    """Write a rendered page and its JSON text beside it (a stored run report, or a fresh
    one from ``write_report``)."""
    json_path = html_path.with_suffix(".json")
    out_dir(html_path.parent)
    try:
        html_path.write_text(html, encoding="utf-8")
        json_path.write_text(data)
    except OSError as exc:  # --out names a place nothing can be written
        raise UsageError(f"--out {html_path.parent}: cannot write there: {exc.strerror}") from exc
    return html_path, json_path


def out_dir(path: Path) -> Path:
    """``path``, created if need be: a report's directory, checked before any work is done
    (a bad ``--out`` changes nothing, not even the stored pages)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write there: {exc.strerror}") from exc
    return path
