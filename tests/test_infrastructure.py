"""Infrastructure is not a regression: which bad outcomes blame the machine (held to the code
that writes them), and a scan that lists those cases apart, on SQLite and PostgreSQL, opening
no regression for them, while the kernel's own failures beside them are new failures as
before. The end-to-end timeout under load is in tests/test_confirm.py."""

from __future__ import annotations

import dataclasses

from reports_support import cases, synthetic_results, write_run
from sqlalchemy.orm import Session

from convmatrix.compare.infrastructure import (
    blames_kernel_when_reproduced,
    infrastructure,
    infrastructure_cause,
    infrastructure_lines,
)
from convmatrix.core.case import Case
from convmatrix.core.records import CaseResult
from convmatrix.db import open_database
from convmatrix.db.engine import write_session
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.runners.case.execute import Context, _time, run_case, run_guarded
from convmatrix.runners.case.interrupts import kernel_crash_message
from convmatrix.service.alert_pages import alert_page
from convmatrix.service.scan import scan_run

CASE = Case("t", "fwd", 3, 4, 1, seqlen=8)


class Raising(TorchKernel):
    """Raises ``error`` on every forward call."""

    name = "raising"

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def forward(self, *args, **kwargs):
        raise self.error


def test_the_outcomes_the_runners_write_are_classed_by_who_caused_them():
    # The harness failing (here: a context without a kernel) is the machine's.
    harness = run_guarded(CASE, Context(kernel=object()))
    assert harness.outcome == "error" and harness.message.startswith("harness error: ")
    assert infrastructure_cause(harness) == "harness error"
    # A kernel raising an exception failed; one raising a BaseException crashed: both its own.
    raised = run_case(CASE, Context(Raising(ValueError("bad stride"))))
    assert (raised.outcome, infrastructure_cause(raised)) == ("failed", None)
    exited = run_case(CASE, Context(Raising(SystemExit(3))))
    assert exited.outcome == "crashed" and exited.message == kernel_crash_message(SystemExit(3))
    assert infrastructure_cause(exited) is None
    # A kernel raising while its passed case is timed errs, and it is the kernel's.
    timed = CaseResult(dataclasses.replace(CASE, timed=True), "passed")
    _time(timed.case, Context(Raising(RuntimeError("no timer"))), timed)
    assert timed.outcome == "error" and infrastructure_cause(timed) is None
    # Deaths, losses and timeouts, as the executors write them.
    died = CaseResult(CASE, "crashed", message="the worker process died while running this case")
    again = dataclasses.replace(
        died, retries=1, retry_reason="crashed on gpu-1; confirming on another device"
    )
    timeout = CaseResult(CASE, "timeout", 3.0, "no result after 3 s (the per-case limit)")
    lost = CaseResult(CASE, "lost", message="no result arrived for this case")
    assert [infrastructure_cause(r) for r in (died, again, timeout, lost)] == [
        "lost worker", None, "timeout", "lost worker",
    ]  # fmt: skip
    assert blames_kernel_when_reproduced("timeout") and blames_kernel_when_reproduced("lost worker")
    assert not blames_kernel_when_reproduced("harness error")
    lines = infrastructure_lines(infrastructure([harness, raised, died, timeout]))
    assert lines[0].startswith(
        "infrastructure: 3 cases not judged (1 harness error, 1 lost worker, 1 timeout)"
    )


def _machine_failed(result: CaseResult, outcome: str, message: str) -> CaseResult:
    return dataclasses.replace(result, outcome=outcome, message=message, outputs=[])


def test_a_scan_lists_what_the_machine_failed_apart_and_blames_only_the_kernel(db_url):
    n = 30
    grid = cases(n)
    engine = open_database(db_url)
    write_run(engine, synthetic_results(n, extras=False), commit="1" * 40)
    broken = {c.id for c in grid[4:7]}  # the kernel's failures beside the machine's
    head = synthetic_results(n, bug=lambda c: c.id in broken, extras=False)
    by_machine = {
        0: ("timeout", "no result after 3 s (the per-case limit); worker restarted"),
        1: ("lost", "no result arrived for this case (its worker was lost before reporting)"),
        2: ("crashed", "the worker process died while running this case (signal 9)"),
        3: ("error", "harness error: Traceback ... MemoryError"),
    }
    for i, (outcome, message) in by_machine.items():
        head[i] = _machine_failed(head[i], outcome, message)
    second = write_run(engine, head, commit="2" * 40)
    with write_session(engine) as session:
        scan = scan_run(session, second)
    assert {r.case_id for r in scan.new} == broken and scan.reopened == []
    assert {c.case_id: c.cause for c in scan.infrastructure} == {
        grid[0].id: "timeout", grid[1].id: "lost worker", grid[2].id: "lost worker",
        grid[3].id: "harness error",
    }  # fmt: skip
    with Session(engine) as session:
        page = alert_page(session, db_url, scan.alert_id)
    assert {n.case.case_id for n in page.not_judged} == {grid[i].id for i in by_machine}
    assert all(n.rerun_outcome is None for n in page.not_judged)  # no confirmation yet
    assert {r.case_id for r in page.alert.regressions} == broken

    # The next night the kernel fails the case that had timed out: that is new, against a
    # baseline that never judged it.
    third = synthetic_results(n, bug=lambda c: c.id in broken or c.id == grid[0].id, extras=False)
    with write_session(engine) as session:
        later = scan_run(session, write_run(engine, third, commit="3" * 40))
    (reg,) = later.new
    assert reg.case_id == grid[0].id and reg.detail.startswith("timeout -> failed: ")
    assert later.infrastructure == []
    engine.dispose()
