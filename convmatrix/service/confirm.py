"""Judging a confirmation rerun: which of a run's new regressions reproduce.

A regression is ``confirmed`` when the rerun (a side run labelled ``confirm:<run>``, made by
``pipeline.confirm``) still shows it against the regression's last good run, by the same
rules that found it, and ``flaky`` when it does not. Alert fatigue is the usual complaint
about regression services; a failure that does not reproduce is told apart before anyone is
paged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from convmatrix.compare.runs import DiffOptions
from convmatrix.db.models import RegressionRow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.service.alerts import record_confirmation
from convmatrix.service.regressions import Regression, list_regressions, set_state
from convmatrix.service.scan import compare_against, flagged_keys

__all__ = ["Confirmation", "judge_rerun", "pending"]


@dataclass
class Confirmation:
    run_id: int
    rerun_id: int | None
    confirmed: list[Regression]
    flaky: list[Regression]

    def lines(self) -> list[str]:
        """What a terminal shows of it."""
        if self.rerun_id is None:
            return [f"confirm: run {self.run_id} has no detected regression to confirm"]
        head = (
            f"confirm: run {self.run_id} rerun as run {self.rerun_id}: "
            f"{len(self.confirmed)} confirmed, {len(self.flaky)} flaky"
        )
        return [head, *("  " + reg.line() for reg in self.confirmed + self.flaky)]


def pending(session: Session, spec: str | int) -> tuple[RunInfo, list[Regression]]:
    """The run ``spec`` names and its regressions still ``detected`` (first bad in it)."""
    run = resolve_run(session, spec)
    ids = session.scalars(
        select(RegressionRow.id).where(
            RegressionRow.first_bad_run == run.id, RegressionRow.state == "detected"
        )
    ).all()
    return run, list_regressions(session, ids=ids) if ids else []


def judge_rerun(
    session: Session,
    regressions: Sequence[Regression],
    rerun_id: int,
    options: DiffOptions | None = None,
) -> tuple[list[Regression], list[Regression]]:
    """(confirmed, flaky): each regression's key flagged again, or not, by the comparison of
    its last good run with the rerun. The states are set, with events by ``confirm``."""
    options = options or DiffOptions()
    rerun = resolve_run(session, rerun_id)
    results = load_results(session, rerun_id)
    flagged: dict[int | None, set] = {}
    confirmed, flaky = [], []
    for reg in regressions:
        if reg.last_good_run not in flagged:
            good = resolve_run(session, reg.last_good_run) if reg.last_good_run else None
            view = compare_against(session, good, rerun, results, options)
            flagged[reg.last_good_run] = flagged_keys(view)
        again = reg.key in flagged[reg.last_good_run]
        state = "confirmed" if again else "flaky"
        note = f"rerun {rerun_id}: " + ("reproduced" if again else "did not reproduce")
        updated = set_state(session, reg.id, state, by="confirm", note=note, run_id=rerun_id)
        (confirmed if again else flaky).append(updated)
    for alert_id in {r.alert_id for r in regressions if r.alert_id is not None}:
        record_confirmation(session, alert_id, rerun_id)
    return confirmed, flaky
