"""Confirmation before alerting: rerun the cases of a run's new regressions, then judge.

A regression is ``confirmed`` when the rerun (a side run labelled ``confirm:<run>``, on another
device of the same kind when the machine has one) still shows it against the regression's last
good run, by the same diff rules that found it, and ``flaky`` when it does not. Alert
fatigue is the usual complaint about regression services; a failure that does not reproduce
is told apart before anyone is paged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from convmatrix.compare.runs import DiffOptions
from convmatrix.db.models import RegressionRow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.reports.viewmodel import RunHeader, run_header
from convmatrix.service.regressions import (
    Regression,
    compare_against,
    flagged_keys,
    list_regressions,
    set_state,
)

__all__ = ["Confirmation", "RerunRequest", "confirm", "judge_rerun", "pending"]


@dataclass(frozen=True)
class RerunRequest:
    """What to rerun: these cases of this run's kernel and matrix, labelled as a side run."""

    header: RunHeader
    case_ids: list[str]
    label: str


@dataclass
class Confirmation:
    run_id: int
    rerun_id: int | None
    confirmed: list[Regression]
    flaky: list[Regression]


def pending(session: Session, spec: str | int, url: str) -> tuple[RunInfo, list[Regression]]:
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
    url: str,
    options: DiffOptions | None = None,
) -> tuple[list[Regression], list[Regression]]:
    """(confirmed, flaky): each regression's key flagged again, or not, by the diff of its last
    good run against the rerun. The states are set, with events by ``confirm``."""
    options = options or DiffOptions()
    results = load_results(session, rerun_id)
    flagged: dict[int | None, set] = {}
    confirmed, flaky = [], []
    for reg in regressions:
        if reg.last_good_run not in flagged:
            good = resolve_run(session, reg.last_good_run) if reg.last_good_run else None
            view = compare_against(session, good, results, options)
            flagged[reg.last_good_run] = set(flagged_keys(view))
        again = reg.key in flagged[reg.last_good_run]
        state = "confirmed" if again else "flaky"
        note = f"rerun {rerun_id}: " + ("reproduced" if again else "did not reproduce")
        updated = set_state(session, reg.id, state, by="confirm", note=note, run_id=rerun_id)
        (confirmed if again else flaky).append(updated)
    return confirmed, flaky


def confirm(
    open_writing: Callable[[], AbstractContextManager[tuple[Session, str]]],
    spec: str | int,
    rerun: Callable[[RerunRequest], int],
) -> Confirmation:
    """Rerun the cases of run ``spec``'s detected regressions (``rerun`` runs them and returns
    the new run's id) and mark each confirmed or flaky. ``open_writing()`` is a context
    manager yielding ``(session, url)`` in a write transaction."""
    with open_writing() as (session, url):
        run, regs = pending(session, spec, url)
        header = run_header(run, url)
    if not regs:
        return Confirmation(run.id, None, [], [])
    case_ids = sorted({r.case_id for r in regs})
    rerun_id = rerun(RerunRequest(header=header, case_ids=case_ids, label=f"confirm:{run.id}"))
    with open_writing() as (session, url):
        confirmed, flaky = judge_rerun(session, regs, rerun_id, url)
    return Confirmation(run.id, rerun_id, confirmed, flaky)
