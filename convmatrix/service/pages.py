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

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from convmatrix.core.case import Case
from convmatrix.core.errors import InputError, UsageError
from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, RUN_KINDS
from convmatrix.db.engine import redact_url
from convmatrix.db.models import CaseRow, MetricRow, PropertyRow, RegressionRow, Run
from convmatrix.db.queries import RunInfo, resolve_run, run_values
from convmatrix.reports.diff import DiffView, build_diff
from convmatrix.reports.history_view import parse_since
from convmatrix.reports.run_view import rerun_command
from convmatrix.reports.source import load_run
from convmatrix.reports.viewmodel import RunHeader, run_header
from convmatrix.service.alert_pages import chunks
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
    query = select(Run).order_by(Run.started_at.desc(), Run.id.desc()).limit(limit)
    columns = {"kernel": Run.kernel, "label": Run.label, "device": Run.device_kind,
               "matrix": Run.matrix}  # fmt: skip
    for name, column in columns.items():
        if filters.get(name):
            query = query.where(column == filters[name])
    kind = filters.get("kind") or "run"
    if kind not in (*RUN_KINDS, "all"):
        raise InputError(f"kind {kind!r}: choose from {', '.join(RUN_KINDS)}, all")
    if kind != "all":
        query = query.where(Run.kind == kind)
    if filters.get("since"):
        query = query.where(Run.started_at >= parse_since(filters["since"]))
    if filters.get("until"):
        until = parse_since(filters["until"])
        assert until is not None
        if len(filters["until"]) == 10:  # a date: the whole day
            until += timedelta(days=1)
        query = query.where(Run.started_at < until)
    rows = []
    for run in session.scalars(query):
        info = resolve_run(session, run.id)
        bad = any(info.counts.get(o) for o in BAD_OUTCOMES)
        verdict = "FAILED" if bad else "PASSED" if info.status == "finished" else info.status
        rows.append(RunRow(
            id=info.id, kernel=info.kernel, commit=info.kernel_commit, label=info.label,
            device=info.device_kind, matrix=info.matrix, started_at=_iso(info.started_at),
            status=info.status, counts={o: info.counts[o] for o in OUTCOMES}, verdict=verdict,
        ))  # fmt: skip
    choices = run_values(session, {name: column.key for name, column in columns.items()})
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
    query = (
        select(CaseRow.id, CaseRow.case_id, CaseRow.run_id, CaseRow.outcome, CaseRow.message)
        .join(Run, Run.id == CaseRow.run_id)
        .where(CaseRow.case_id.startswith(case_id, autoescape=True))
        .order_by(Run.started_at, Run.id)
    )
    if kernel:
        query = query.where(Run.kernel == kernel)
    rows = session.execute(query).all()
    ids = {r.case_id for r in rows}
    if not ids:
        raise UsageError(f"case {case_id!r}: no run holds it")
    if len(ids) > 1:
        raise UsageError(f"case {case_id!r} is ambiguous: {', '.join(sorted(ids))}")
    full_id = ids.pop()
    metrics: dict[int, list[Any]] = {}
    pks = [r.id for r in rows]
    for m in session.execute(
        select(MetricRow.case_pk, MetricRow.output, MetricRow.e_rel, MetricRow.e_norm,
               MetricRow.bound_usage, MetricRow.usage_limit, MetricRow.broken_zeros)
        .where(MetricRow.case_pk.in_(pks)).order_by(MetricRow.id)
    ):  # fmt: skip
        metrics.setdefault(m.case_pk, []).append(m)
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
    stored = session.scalar(  # the one case's parameters, by its key (run, case id)
        select(CaseRow.params).where(CaseRow.run_id == newest.id, CaseRow.case_id == full_id)
    )
    case = Case.from_json(stored)
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
    rows = [
        row
        for batch in chunks(dict.fromkeys(case_ids))
        for row in session.execute(
            select(RegressionRow.id, RegressionRow.alert_id, RegressionRow.kind,
                   RegressionRow.state, RegressionRow.case_id)
            .where(RegressionRow.kernel == run.kernel, RegressionRow.matrix == run.matrix,
                   RegressionRow.device == device,
                   RegressionRow.case_id.in_(batch))
        )
    ]  # fmt: skip
    for r in sorted(rows, key=lambda row: -row.id):
        found.setdefault(r.case_id, []).append(RegressionLink(r.id, r.alert_id, r.kind, r.state))
    return found


def _dtypes(session: Session, run_id: int) -> list[str]:
    return sorted(session.scalars(select(CaseRow.x_dtype).where(CaseRow.run_id == run_id)
                                  .distinct()))  # fmt: skip


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
    base_case, base_metric = aliased(CaseRow), aliased(MetricRow)
    for batch in chunks(found):
        rows = session.execute(
            select(CaseRow.case_id, MetricRow.output, MetricRow.bound_usage,
                   MetricRow.usage_limit, MetricRow.e_rel,
                   base_metric.bound_usage.label("base_usage"))
            .join(MetricRow, MetricRow.case_pk == CaseRow.id)
            .outerjoin(base_case, (base_case.run_id == base_id)
                       & (base_case.case_id == CaseRow.case_id))
            .outerjoin(base_metric, (base_metric.case_pk == base_case.id)
                       & (base_metric.output == MetricRow.output))
            .where(CaseRow.run_id == head_id, CaseRow.case_id.in_(batch), ~MetricRow.passed)
            .order_by(MetricRow.id)
        )  # fmt: skip
        for r in rows:
            found[r.case_id]["outputs"].append({
                "output": r.output, "base_usage": _number(r.base_usage),
                "usage": _number(r.bound_usage), "allowed": _number(r.usage_limit),
                "e_rel": _number(r.e_rel),
            })  # fmt: skip
        props = session.execute(
            select(CaseRow.case_id, PropertyRow.name, PropertyRow.detail)
            .join(PropertyRow, PropertyRow.case_pk == CaseRow.id)
            .where(CaseRow.run_id == head_id, CaseRow.case_id.in_(batch), ~PropertyRow.passed)
            .order_by(PropertyRow.id)
        )
        for p in props:
            found[p.case_id]["properties"].append({"name": p.name, "detail": p.detail})
    return found


def run_links(session: Session, run: RunInfo) -> dict[str, list[RegressionLink]]:
    """The regressions a served run page links from its failing cases (``_case_regressions``
    of them), read without the view-model, regressions first: usually few or none for the
    run's kernel, matrix and device, so a stored page's check costs one small query, not a
    read of the run's failing cases. A stored page is served only while this stays the same."""
    regressions = session.execute(
        select(RegressionRow.case_id).where(
            RegressionRow.kernel == run.kernel, RegressionRow.matrix == run.matrix,
            RegressionRow.device == run.device_kind,
        ).distinct()
    ).scalars().all()  # fmt: skip
    failing = [
        case_id
        for batch in chunks(regressions)
        for case_id in session.scalars(
            select(CaseRow.case_id).where(
                CaseRow.run_id == run.id, CaseRow.case_id.in_(batch),
                CaseRow.outcome.in_(BAD_OUTCOMES),
            )
        )
    ]  # fmt: skip
    return _case_regressions(session, run, sorted(failing)) if failing else {}


def run_context(
    session: Session, run: RunInfo, links: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a served run page shows beyond its view-model (see the module's text); ``links``:
    its ``run_links``, when read already."""
    return {"case_regressions": run_links(session, run) if links is None else links,
            "dtypes": _dtypes(session, run.id)}  # fmt: skip


def served_context(session: Session, view: Any) -> dict[str, Any]:
    """What a served diff page shows beyond its view-model (see the module's text); a run
    page's is ``run_context``."""
    if view.kind == "diff":
        new = [c.case_id for c in view.new_failures]
        ids = new + [c.case_id for c in view.still_failing + view.fixed]
        return {
            "case_regressions": _case_regressions(session, view.head, ids),
            "failure_details": failure_details(session, view.base.id, view.head.id, new),
            "dtypes": _dtypes(session, view.head.id),
        }
    return {}
