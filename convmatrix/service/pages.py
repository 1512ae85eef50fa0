"""The view-models of the served pages: the same builders as the static reports for a run,
a diff and a dtype history, plus pages only the service has (the runs index, one case's
history across runs and commits; alerts and regressions are in ``alert_pages``). Plain
dataclasses, read from the database; ``app`` renders them through the report templates and
returns them as JSON.

``served_context`` adds what only a served page shows beside a run or a diff (links to each
case's regressions, the failing outputs of each new failure, the dtypes for History links):
it goes to the template, never into the JSON, which stays the static report's view-model."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from convmatrix.core.case import Case
from convmatrix.core.errors import InputError, UsageError
from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, RUN_KINDS
from convmatrix.db.case_queries import (
    case_across_runs,
    case_metrics,
    case_outcomes,
    case_params,
    failed_outputs,
    failed_properties,
    run_dtypes,
)
from convmatrix.db.engine import redact_url
from convmatrix.db.queries import RunInfo, list_runs, resolve_run, run_values
from convmatrix.db.regression_queries import lineage_case_ids, regression_links
from convmatrix.reports.diff import DiffView, build_diff
from convmatrix.reports.history_view import parse_since
from convmatrix.reports.run_view import rerun_command
from convmatrix.reports.source import load_run
from convmatrix.reports.viewmodel import RunHeader, run_header
from convmatrix.service.regressions import Regression, list_regressions

__all__ = [
    "CaseHistoryView",
    "RunsView",
    "case_page",
    "diff_page",
    "run_context",
    "run_links",
    "runs_page",
    "served_context",
]

RUN_FILTERS = ("kernel", "label", "device", "matrix", "kind", "since", "until")


@dataclass
class RunRow:
    id: int
    kernel: str
    commit: str | None
    label: str | None
    device: str
    matrix: str
    started_at: str
    status: str
    counts: dict[str, int]
    verdict: str  # PASSED, FAILED or the status of a run that did not finish


@dataclass
class RunsView:
    kind: str
    database: str
    filters: dict[str, str]
    runs: list[RunRow]
    choices: dict[str, list[str]]  # filter -> the values the database holds


@dataclass
class CaseRun:
    """The case in one run: outcome, message and the errors of each output."""

    run_id: int
    commit: str | None
    label: str | None
    device: str
    started_at: str
    outcome: str
    message: str | None
    e_rel: dict[str, float | None]  # output -> e_rel (None: NaN)
    e_norm: dict[str, float | None]
    usage: dict[str, float | None] = field(default_factory=dict)  # output -> bound usage
    usage_limit: dict[str, float | None] = field(default_factory=dict)  # allowed, if judged
    broken_zeros: dict[str, int | None] = field(default_factory=dict)  # expected 0, non-zero


@dataclass
class CaseHistoryView:
    kind: str
    database: str
    case_id: str
    name: str
    kernel: str | None
    params: dict[str, Any]
    outputs: list[str]
    runs: list[CaseRun]
    rerun: str  # the command that reruns this case as the newest run did
    regressions: list[Regression]


def _iso(moment: Any) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


def runs_page(session: Session, url: str, filters: dict[str, str], limit: int = 200) -> RunsView:
    """The newest runs, filtered by kernel, label, device kind, matrix, kind and a date range
    (``since``/``until``: ISO dates or ``30d``). Plain runs only unless ``kind`` says
    otherwise (``confirm``, ``bisect``, ``adequacy``, or ``all``)."""
    unknown = [k for k in filters if k not in RUN_FILTERS]
    if unknown:
        raise InputError(f"filter {unknown[0]!r}: choose from {', '.join(RUN_FILTERS)}")
    columns = {"kernel": "kernel", "label": "label", "device": "device_kind",
               "matrix": "matrix"}  # fmt: skip
    kind = filters.get("kind") or "run"
    if kind not in (*RUN_KINDS, "all"):
        raise InputError(f"kind {kind!r}: choose from {', '.join(RUN_KINDS)}, all")
    since = parse_since(filters["since"]) if filters.get("since") else None
    until = parse_since(filters["until"]) if filters.get("until") else None
    if until is not None and len(filters["until"]) == 10:  # a date: the whole day
        until += timedelta(days=1)
    found = list_runs(
        session, limit=limit, kinds=None if kind == "all" else (kind,),
        equal={column: filters[name] for name, column in columns.items() if filters.get(name)},
        since=since, until=until,
    )  # fmt: skip
    rows = []
    for info in found:
        bad = any(info.counts.get(o) for o in BAD_OUTCOMES)
        verdict = "FAILED" if bad else "PASSED" if info.status == "finished" else info.status
        rows.append(RunRow(
            id=info.id, kernel=info.kernel, commit=info.kernel_commit, label=info.label,
            device=info.device_kind, matrix=info.matrix, started_at=_iso(info.started_at),
            status=info.status, counts={o: info.counts[o] for o in OUTCOMES}, verdict=verdict,
        ))  # fmt: skip
    choices = run_values(session, columns)
    choices["kind"] = [k for k in RUN_KINDS if k != "run"] + ["all"]  # none chosen: plain runs
    return RunsView(kind="runs", database=redact_url(url), runs=rows, choices=choices,
                    filters={k: v for k, v in filters.items() if v})  # fmt: skip


def diff_page(session: Session, url: str, base: str, head: str) -> DiffView:
    old = load_run(session, base, url, what="BASE")
    new = load_run(session, head, url, what="HEAD")
    return build_diff(old.header, old.results, new.header, new.results)


def _value(v: float | None) -> float | None:
    return None if v is None else float(v)


def case_page(
    session: Session, url: str, case_id: str, kernel: str | None = None
) -> CaseHistoryView:
    """One case (id or unique prefix) in every run that holds it, oldest first: per output its
    bound usage (what it was allowed, its elements expected 0 that were not) beside e_rel."""
    rows = case_across_runs(session, prefix=case_id, kernel=kernel)
    ids = {r.case_id for r in rows}
    if not ids:
        raise UsageError(f"case {case_id!r}: no run holds it")
    if len(ids) > 1:
        raise UsageError(f"case {case_id!r} is ambiguous: {', '.join(sorted(ids))}")
    full_id = ids.pop()
    metrics = case_metrics(session, [r.id for r in rows])
    runs, outputs = [], []
    for row in rows:
        info = resolve_run(session, row.run_id)
        ms = metrics.get(row.id, [])
        outputs += [m.output for m in ms if m.output not in outputs]
        runs.append(CaseRun(
            run_id=info.id, commit=info.kernel_commit, label=info.label,
            device=info.device_kind, started_at=_iso(info.started_at), outcome=row.outcome,
            message=row.message, e_rel={m.output: _value(m.e_rel) for m in ms},
            e_norm={m.output: _value(m.e_norm) for m in ms},
            usage={m.output: _value(m.bound_usage) for m in ms},
            usage_limit={m.output: _value(m.usage_limit) for m in ms},
            broken_zeros={m.output: m.broken_zeros for m in ms},
        ))  # fmt: skip
    newest = resolve_run(session, runs[-1].run_id)
    case = Case.from_json(case_params(session, newest.id, full_id))
    params = {k: v for k, v in case.to_json().items() if v is not None}
    return CaseHistoryView(
        kind="case", database=redact_url(url), case_id=full_id, name=case.pytest_id,
        kernel=kernel, params=params, outputs=outputs, runs=runs,
        rerun=rerun_command(run_header(newest, url), [full_id]),
        regressions=list_regressions(session, case_id=full_id, kernel=kernel),
    )  # fmt: skip


@dataclass
class RegressionLink:
    """A regression a served page links a case to."""

    id: int
    alert_id: int | None
    kind: str
    state: str


def _case_regressions(
    session: Session, run: RunHeader | RunInfo, case_ids: list[str]
) -> dict[str, list[RegressionLink]]:
    """The regressions of ``run``'s kernel, matrix and device for these cases, newest first."""
    device = run.device_kind if isinstance(run, RunInfo) else run.device.split(" ", 1)[0]
    found: dict[str, list[RegressionLink]] = {}
    for r in regression_links(session, run.kernel, run.matrix, device, case_ids):
        found.setdefault(r.case_id, []).append(RegressionLink(r.id, r.alert_id, r.kind, r.state))
    return found


def _number(value: float | None) -> float | None:
    return None if value is None or value != value else float(value)


def failure_details(
    session: Session, base_id: int, head_id: int, case_ids: list[str]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Each case's failing outputs in run ``head_id`` (bound usage, and in ``base_id``; the
    usage allowed) and its failed property checks: what a new failure's row names."""
    found: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {"outputs": [], "properties": []} for c in case_ids
    }
    for r in failed_outputs(session, base_id, head_id, found):
        found[r.case_id]["outputs"].append({
            "output": r.output, "base_usage": _number(r.base_usage),
            "usage": _number(r.bound_usage), "allowed": _number(r.usage_limit),
            "e_rel": _number(r.e_rel),
        })  # fmt: skip
    for p in failed_properties(session, head_id, found):
        found[p.case_id]["properties"].append({"name": p.name, "detail": p.detail})
    return found


def run_links(session: Session, run: RunInfo) -> dict[str, list[RegressionLink]]:
    """The regressions a served run page links from its failing cases (``_case_regressions``
    of them), read without the view-model, regressions first: usually few or none for the
    run's kernel, matrix and device, so a stored page's check costs one small query, not a
    read of the run's failing cases. A stored page is served only while this stays the same."""
    regressions = lineage_case_ids(session, run.kernel, run.matrix, run.device_kind)
    failing = list(case_outcomes(session, run.id, regressions, BAD_OUTCOMES))
    return _case_regressions(session, run, sorted(failing)) if failing else {}


def run_context(
    session: Session, run: RunInfo, links: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a served run page shows beyond its view-model (see the module's text); ``links``:
    its ``run_links``, when read already."""
    return {"case_regressions": run_links(session, run) if links is None else links,
            "dtypes": run_dtypes(session, run.id)}  # fmt: skip


def served_context(session: Session, view: Any) -> dict[str, Any]:
    """What a served diff page shows beyond its view-model (see the module's text); a run
    page's is ``run_context``."""
    if view.kind == "diff":
        new = [c.case_id for c in view.new_failures]
        ids = new + [c.case_id for c in view.still_failing + view.fixed]
        return {
            "case_regressions": _case_regressions(session, view.head, ids),
            "failure_details": failure_details(session, view.base.id, view.head.id, new),
            "dtypes": run_dtypes(session, view.head.id),
        }
    return {}
