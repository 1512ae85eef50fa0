"""Judging a confirmation rerun: which of a run's new regressions reproduce, and which of the
cases the machine failed to judge were the kernel's after all.

A confirmation reruns, as side runs labelled ``confirm:<run>`` (the kernel at the run's
commit) and ``confirm-base:<run>`` (at its baseline's commit, where that is a checkout away),
made by ``pipeline.confirm``:

- the cases of the regressions the run raised. One is ``confirmed`` when the rerun still shows
  it against the regression's last good run, by the same rules that found it, and against the
  baseline's rerun when there is one; ``flaky`` when it does not (an out-of-bounds read returns
  other garbage each run: blaming the commit for it would be wrong). The values of the run and
  of the reruns go in the event's note and beside each output (``rerun_usage``,
  ``rerun_base_usage``). A rerun that could not judge the case (a timeout there) leaves it
  ``detected``, saying so.
- the cases the machine failed to judge (``compare.infrastructure``), with a longer limit. What
  the rerun judges bad against the baseline, and a timeout or a crash that happens again, is
  filed as a new regression of the run (``service.scan.file_findings``), ``confirmed``; what
  passes was the machine. A harness error stays the harness's.

Alert fatigue is the usual complaint about regression services; a failure that does not
reproduce is told apart before anyone is paged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from convmatrix.compare.findings import Finding, findings, new_failure
from convmatrix.compare.infrastructure import (
    RERUN_LIMIT_FACTOR,
    Infrastructure,
    blames_kernel_when_reproduced,
    infrastructure,
    infrastructure_cause,
)
from convmatrix.compare.runs import DiffOptions
from convmatrix.core.recorded import Recorded
from convmatrix.core.records import CaseResult
from convmatrix.db.models import AlertRow, RegressionRow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.db.regression_queries import regressions_raised_by_scan
from convmatrix.service.alerts import record_confirmation, refresh_explanation
from convmatrix.service.regressions import (
    Regression,
    list_regressions,
    plain,
    record_event,
    set_state,
)
from convmatrix.service.scan import baseline_run, by_id, compare_against, file_findings

__all__ = ["Confirmation", "Pending", "judge_rerun", "pending", "rerun_limit"]


@dataclass
class Pending:
    """What a confirmation of ``run`` reruns: the regressions it raised that are still
    ``detected``, and its cases the machine failed to judge."""

    run: RunInfo
    regressions: list[Regression]
    infrastructure: list[Infrastructure]
    timeouts_s: list[float] = field(default_factory=list)  # the limits its timeouts ran out at

    @property
    def case_ids(self) -> list[str]:
        return sorted(
            {r.case_id for r in self.regressions} | {c.case_id for c in self.infrastructure}
        )


@dataclass
class Confirmation:
    run_id: int
    rerun_id: int | None
    confirmed: list[Regression]
    flaky: list[Regression]
    base_rerun_id: int | None = None  # the rerun at the baseline's commit, where made
    unjudged: list[Regression] = field(default_factory=list)  # the rerun could not judge them
    reproduced: list[Regression] = field(default_factory=list)  # filed from infrastructure
    cleared: list[Infrastructure] = field(default_factory=list)  # the machine's after all
    limit_s: float | None = None  # the rerun's per-case limit (None: the matrix's)
    notes: list[str] = field(default_factory=list)  # why no base rerun, ...

    @property
    def rejudged(self) -> set[str]:
        """The cases the machine failed to judge in the run that the rerun judged: the
        machine's after all (cleared), or reproduced and filed."""
        return {c.case_id for c in self.cleared} | {r.case_id for r in self.reproduced}

    def lines(self) -> list[str]:
        """What a terminal shows of it."""
        if self.rerun_id is None:
            return [
                f"confirm: run {self.run_id} has no detected regression to confirm and no case "
                "the machine failed to judge"
            ]
        base = f" (baseline rerun as run {self.base_rerun_id})" if self.base_rerun_id else ""
        limit = f", limit {self.limit_s:g} s a case" if self.limit_s else ""
        head = (
            f"confirm: run {self.run_id} rerun as run {self.rerun_id}{base}{limit}: "
            f"{len(self.confirmed)} confirmed, {len(self.flaky)} flaky"
        )
        if self.unjudged:
            head += f", {len(self.unjudged)} not judged by the rerun"
        if self.reproduced or self.cleared:
            head += (
                f"; not judged before: {len(self.reproduced)} reproduced (new regressions), "
                f"{len(self.cleared)} the machine's"
            )
        regs = self.confirmed + self.flaky + self.unjudged + self.reproduced
        return [head, *("  " + n for n in self.notes), *("  " + reg.line() for reg in regs)]


def pending(session: Session, spec: str | int) -> Pending:
    """What a confirmation of run ``spec`` reruns (``Pending``)."""
    run = resolve_run(session, spec)
    ids = regressions_raised_by_scan(session, run.id)
    regressions = list_regressions(session, ids=ids) if ids else []
    bad = [r for r in load_results(session, run.id) if infrastructure_cause(r) is not None]
    timeouts = [r.duration_s for r in bad if r.outcome == "timeout" and r.duration_s > 0]
    return Pending(run, regressions, infrastructure(bad), timeouts)


def rerun_limit(todo: Pending) -> float | None:
    """The rerun's per-case limit: ``RERUN_LIMIT_FACTOR`` times the limit the run's cases
    timed out at (or its ``--case-timeout``); None (the matrix's) when none timed out."""
    if not todo.timeouts_s:
        return None
    limits = [*todo.timeouts_s, Recorded.of(todo.run.options).case_timeout or 0.0]
    return RERUN_LIMIT_FACTOR * max(limits)


def _measure(result: CaseResult | None, entry: Mapping[str, Any]) -> str:
    """The value a regression's output entry shows, as ``result`` has it."""
    if result is None:
        return "absent"
    if "scope" in entry:
        scope = entry["scope"].split("/")[0]
        times = [t.median_s for t in result.timings if t.scope == scope]
        return f"{times[0]:.3g}s" if times else result.outcome
    m = next((o for o in result.outputs if o.output == entry.get("output")), None)
    if m is None:
        return result.outcome
    if m.bound_usage is not None:
        zeros = f" (+{m.broken_zeros} zeros broken)" if m.broken_zeros else ""
        return f"usage {m.bound_usage:.3g}{zeros}"
    return f"e_rel {m.e_rel:.3g}"


def _values(reg: Regression, rerun: CaseResult | None, base: CaseResult | None) -> str:
    """The run's values and the reruns' side by side: what a flaky mark is shown with."""
    if reg.kind == "new_failure":
        again = rerun.outcome if rerun is not None else "absent"
        was = f"; baseline rerun: {base.outcome}" if base is not None else ""
        return f"run {reg.first_bad_run}: {reg.detail}; rerun: {again}{was}"
    parts = []
    for o in reg.outputs:
        name = o.get("scope") or o.get("output")
        before = o.get("base_median_s") if "scope" in o else o.get("base_usage", o.get("base_rel"))
        after = o.get("median_s") if "scope" in o else o.get("usage", o.get("e_rel"))
        text = f"{name} {_num(before)} -> {_num(after)} in run {reg.first_bad_run}; rerun "
        text += _measure(rerun, o)
        if base is not None:
            text += f", baseline rerun {_measure(base, o)}"
        parts.append(text)
    return "; ".join(parts)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def _note_rerun_values(
    session: Session, reg: Regression, rerun: CaseResult | None, base: CaseResult | None
) -> None:
    """Each output entry of ``reg`` gets the reruns' values beside the run's."""
    row = session.get(RegressionRow, reg.id)
    if row is None or not row.outputs:
        return
    entries = []
    for o in row.outputs:
        entry = dict(o)
        entry["rerun"] = _measure(rerun, o)
        if base is not None:
            entry["rerun_base"] = _measure(base, o)
        entries.append(entry)
    row.outputs = entries  # a new list: the JSON column sees the change
    session.flush()


class _Judge:
    """A rerun (and the baseline's rerun) against what each regression was found against."""

    def __init__(self, session: Session, rerun_id: int, options: DiffOptions) -> None:
        self.session, self.options = session, options
        self.rerun = resolve_run(session, rerun_id)
        self.results = load_results(session, rerun_id)
        self.by_case = by_id(self.results)
        self._found: dict[int | None, dict[tuple[str, str], Finding]] = {}

    def against(self, run_id: int | None) -> dict[tuple[str, str], Finding]:
        """What the rerun shows against run ``run_id`` (None: no run, every bad case)."""
        if run_id not in self._found:
            good = resolve_run(self.session, run_id) if run_id is not None else None
            view = compare_against(self.session, good, self.rerun, self.results, self.options)
            base = by_id(load_results(self.session, run_id)) if run_id is not None else {}
            self._found[run_id] = findings(view, self.by_case, base)
        return self._found[run_id]


def _judge_regression(
    session: Session,
    reg: Regression,
    judge: _Judge,
    base_judge: _Judge | None,
    pair: set[tuple[str, str]] | None,
) -> str | None:
    """The state ``reg`` goes to (None: the rerun could not judge it), with its event;
    ``pair``: what the head's rerun shows against the baseline's rerun, where one was made."""
    rerun = judge.by_case.get(reg.case_id)
    base = base_judge.by_case.get(reg.case_id) if base_judge is not None else None
    if rerun is None or infrastructure_cause(rerun) is not None:
        why = "absent" if rerun is None else f"{rerun.outcome} ({infrastructure_cause(rerun)})"
        note = f"rerun {judge.rerun.id} could not judge it: {why}; left detected"
        record_event(session, session.get(RegressionRow, reg.id), "detected", "confirm",
                     judge.rerun.id, note)  # fmt: skip
        return None
    again = reg.key in judge.against(reg.last_good_run) and (pair is None or reg.key in pair)
    values = _values(reg, rerun, base)
    _note_rerun_values(session, reg, rerun, base)
    state = "confirmed" if again else "flaky"
    note = f"rerun {judge.rerun.id}: " + ("reproduced" if again else "did not reproduce")
    set_state(session, reg.id, state, by="confirm", note=f"{note}: {values}", run_id=judge.rerun.id)
    return state


def _pair(judge: _Judge, base_judge: _Judge) -> set[tuple[str, str]]:
    """The keys the head's rerun shows against the baseline's rerun."""
    view = compare_against(judge.session, base_judge.rerun, judge.rerun, judge.results,
                           judge.options)  # fmt: skip
    return set(findings(view, judge.by_case, base_judge.by_case))


def _infrastructure_findings(
    todo: Pending, judge: _Judge, base: RunInfo | None, limit_s: float | None
) -> tuple[list[Finding], list[Infrastructure]]:
    """(found, cleared) among the cases the machine failed to judge in the run: what the
    rerun shows against the baseline, a timeout or crash happening again; and what it
    judged fine."""
    shown = judge.against(base.id if base is not None else None)
    base_results = by_id(load_results(judge.session, base.id)) if base is not None else {}
    found: list[Finding] = []
    cleared: list[Infrastructure] = []
    for case in todo.infrastructure:
        rerun = judge.by_case.get(case.case_id)
        if rerun is None:
            continue
        cause = infrastructure_cause(rerun)
        if cause is not None and blames_kernel_when_reproduced(cause):
            limit = f" with a {RERUN_LIMIT_FACTOR:g}x limit ({limit_s:g} s)" if limit_s else ""
            note = f"{case.cause} in run {todo.run.id}, {cause} again on rerun{limit}"
            found.append(new_failure(rerun, base_results.get(case.case_id), note))
        elif cause is None:
            kinds = [f for (cid, kind), f in shown.items() if cid == case.case_id
                     and kind != "timing_regression"]  # fmt: skip
            found += kinds
            if not kinds:
                cleared.append(case)
    return found, cleared


def judge_rerun(
    session: Session,
    todo: Pending,
    rerun_id: int,
    base_rerun_id: int | None = None,
    options: DiffOptions | None = None,
) -> Confirmation:
    """Judge the rerun(s) of ``todo`` (see the module's text): states set with events by
    ``confirm``, new regressions filed, the alerts' explanations computed again."""
    options = options or DiffOptions()
    judge = _Judge(session, rerun_id, options)
    base_judge = _Judge(session, base_rerun_id, options) if base_rerun_id else None
    done = Confirmation(todo.run.id, rerun_id, [], [], base_rerun_id, limit_s=rerun_limit(todo))
    pair = _pair(judge, base_judge) if base_judge is not None else None
    for reg in todo.regressions:
        state = _judge_regression(session, reg, judge, base_judge, pair)
        updated = plain(session.get(RegressionRow, reg.id))
        {"confirmed": done.confirmed, "flaky": done.flaky, None: done.unjudged}[state].append(
            updated
        )
    found, done.cleared = _infrastructure_findings(
        todo, judge, baseline_run(session, todo.run), done.limit_s
    )
    note = f"not judged in run {todo.run.id}; rerun {rerun_id}"
    for reg in file_findings(session, todo.run, found, note):
        note = f"rerun {rerun_id}: reproduced"
        done.reproduced.append(
            set_state(session, reg.id, "confirmed", by="confirm", note=note, run_id=rerun_id)
        )
    _close_alerts(session, todo, done, rerun_id)
    return done


def _close_alerts(session: Session, todo: Pending, done: Confirmation, rerun_id: int) -> None:
    """The rerun recorded with every alert it served; their explanations without the flaky."""
    regs: Sequence[Regression] = [*todo.regressions, *done.reproduced]
    alert_ids = {r.alert_id for r in regs if r.alert_id is not None}
    results = None
    for alert_id in sorted(alert_ids):
        record_confirmation(session, alert_id, rerun_id)
        row = session.get(AlertRow, alert_id)
        if row is not None and row.run_id == todo.run.id and done.flaky:
            results = results if results is not None else load_results(session, todo.run.id)
            refresh_explanation(session, row, results, todo.run.geometry)
