"""The plugin's parts that need no pytest session: worker placement, case selection, the
controller's once-per-case rule, the summary, and the watchdog (in a child process, since it
ends its process on purpose)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from convmatrix.core.case import Case
from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult, RunMeta
from convmatrix.runners.executors.xdist.plugin import place_worker
from convmatrix.runners.executors.xdist.watchdog import EXIT_STATUS
from convmatrix.runners.run.account import RunAccount, worst_failures
from convmatrix.runners.run.controller import Controller
from convmatrix.runners.run.store import MemoryStore
from convmatrix.runners.run.threads import ThreadSetting
from convmatrix.runners.run.workload import select_cases


def test_cuda_workers_own_device_n_mod_count_and_see_it_as_zero():
    where = place_worker("gw3", 4, "cuda", 2, cores=16, environ={})
    assert where.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert where.device == "cuda:0" and where.threads is None
    # A parent already restricted to physical devices 4,5: gw0 -> 4, gw1 -> 5, gw2 -> 4.
    parent = {"CUDA_VISIBLE_DEVICES": "4,5"}
    got = [place_worker(f"gw{i}", 3, "cuda", 2, 16, parent).env for i in range(3)]
    assert got == [{"CUDA_VISIBLE_DEVICES": v} for v in ("4", "5", "4")]
    assert place_worker("gw1", 2, "mlu", 2, 16, {}).env == {"MLU_VISIBLE_DEVICES": "1"}


def test_cpu_workers_share_the_cores_under_the_torch_policy():
    old = ThreadSetting("torch", "--threads", None)  # the default policy: tests/test_threads.py
    assert place_worker("gw0", 2, "cpu", 1, 2, {}, old).threads == 1
    assert place_worker("gw5", 3, "cpu", 1, 16, {}, old).threads == 5
    assert place_worker("gw0", 4, "cpu", 1, 2, {}, old).threads == 1
    assert place_worker("gw0", 1, "cpu", 1, 8, {}, old).env == {}


CASES = [Case("t", "fwd", k, 8, 1, seqlen=s) for k in (2, 4) for s in (3, 5)]


def test_case_selection_by_id_prefix_or_pytest_id_minus_done():
    a, b, c, d = CASES
    assert select_cases(CASES) == CASES
    assert select_cases(CASES, [a.id, b.id[:5], c.pytest_id]) == [a, b, c]
    assert select_cases(CASES, [], done=[a.id, d.id]) == [b, c]
    with pytest.raises(UsageError, match="--case nothing: no such case"):
        select_cases(CASES, ["nothing"])
    assert select_cases(CASES, ["nothing"], strict=False) == []


def test_a_case_is_recorded_once_a_timeout_beats_the_crash_report_after_it():
    hung, other = CASES[0], CASES[1]
    planned = {hung.id, other.id, CASES[2].id}
    meta = RunMeta(kernel="k", matrix="m", matrix_hash="h")
    controller = Controller(MemoryStore(), meta, planned, resume=None)
    assert controller.record(CaseResult(hung, "timeout", worker="gw1"))
    assert not controller.crashed(hung, "gw1", "worker 'gw1' crashed")
    assert controller.results[hung.id].outcome == "timeout"
    assert controller.crashed_workers["gw1"] == 1  # the worker did die and was replaced
    assert controller.crashed(other, "gw2", "worker 'gw2' crashed")
    summary = controller.finish(interrupted=False)
    assert summary.status == "interrupted"  # CASES[2] never reported
    assert summary.exit_code == 1 and summary.crashed_workers == 2
    assert not controller.record(CaseResult(CASES[2], "passed"))  # the run is closed


def test_summary_counts_worst_failures_first_and_names_the_run():
    results = [
        CaseResult(CASES[0], "passed"),
        CaseResult(CASES[1], "crashed", message="the worker died"),
        CaseResult(CASES[2], "skipped", message="no backward"),
    ]
    summary = RunAccount(
        run_id=7,
        status="finished",
        counts={"passed": 5, "crashed": 1},
        session={"passed": 1, "skipped": 1, "crashed": 1},
        planned=3,
        worst=worst_failures(results),
    )
    lines = summary.lines()
    assert lines[0] == "worst 1 of 1 failures:"
    assert lines[1].startswith(f"  CRASHED {CASES[1].pytest_id}")
    assert "convmatrix run 7 [finished]: 5 passed, 1 crashed" in lines
    assert "  this session: 1 passed, 1 skipped, 1 crashed" in lines


WATCHDOG = """
import sys, time
from convmatrix.runners.executors.xdist.watchdog import Watchdog
with Watchdog(float(sys.argv[1]), lambda: print("timeout delivered", flush=True)):
    time.sleep(float(sys.argv[2]))
print("case finished", flush=True)
"""


@pytest.mark.parametrize(
    ("limit", "sleep", "status", "out"),
    [("0.5", "30", EXIT_STATUS, "timeout delivered\n"), ("30", "0.1", 0, "case finished\n")],
    ids=["hung", "in-time"],
)
def test_watchdog_delivers_once_then_ends_the_process(limit, sleep, status, out):
    done = subprocess.run(
        [sys.executable, "-c", WATCHDOG, limit, sleep], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (status, out)


def test_every_case_of_a_process_is_watched_by_one_thread():
    """A thread a case (``threading.Timer``) waited for the scheduler on every case."""
    import threading

    from convmatrix.runners.executors.xdist.watchdog import Watchdog

    fired = []
    for _ in range(5):
        with Watchdog(30.0, lambda: fired.append(1)):
            pass
    names = [t.name for t in threading.enumerate()]
    assert names.count("convmatrix-watchdog") == 1 and not fired, names


def test_a_result_recorded_in_process_is_what_its_json_would_give():
    """``-n 0`` records the ``CaseResult`` a case returned as it is (``session.IN_PROCESS``)
    instead of parsing back the JSON it attaches to the report; a worker's controller records
    that JSON. The two must be the same record, whatever the outcome."""
    import json

    from runner_helpers import TINY

    from convmatrix.runners.case.execute import run_guarded
    from convmatrix.runners.options import RunOptions
    from convmatrix.runners.run.controller import prepare

    options = RunOptions(matrix=str(TINY), kernel="torch", workers=0, reference_cache="off")
    prepared = prepare(options.checked(), MemoryStore())
    (workload,) = prepared.workloads.values()
    ctx = prepared.context(workload)
    results = [run_guarded(case, ctx) for case in workload.cases[:6]]
    results.append(CaseResult(workload.cases[0], "crashed", message="bad \x1b[31m text"))
    for result in results:
        result.worker, result.host = "main", "here"
        sent = json.dumps(result.to_json())
        assert CaseResult.from_json(json.loads(sent)) == result, result.case.pytest_id


HARD_LIMIT = """
import re, sys, time
from convmatrix.runners.executors.xdist import watchdog
watchdog.HARD_GRACE_S, watchdog.HARD_SLACK_S, watchdog.IDLE_MARGIN_S = 0.5, 0.5, 1.0
with watchdog.Watchdog(20.0, lambda: None):  # a long limit first: its timer is far off
    pass
for _ in range(50):  # cases in a row
    with watchdog.Watchdog(0.6, lambda: None):
        pass
if sys.argv[1] == "idle":
    time.sleep(3.0)  # outside any case, past the timer's deadline: it must not fire
    print("survived", flush=True)
else:
    with watchdog.Watchdog(0.3, lambda: None):  # the alarm thread never gets the GIL
        re.match(r"(a+)+$", "a" * 40 + "b")  # catastrophic backtracking, GIL held
"""


def test_the_hard_exit_kept_between_cases_never_fires_outside_one():
    """faulthandler's timer stays armed across cases (a C thread started and joined a case
    cost most of the watchdog); outside a case it is cancelled before its deadline."""
    done = subprocess.run(
        [sys.executable, "-c", HARD_LIMIT, "idle"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "survived\n"), done.stderr


def test_a_case_holding_the_gil_still_ends_soon_after_its_own_limit():
    """The timer a longer limit armed is re-armed for a case with a shorter one: faulthandler
    names the timeout it was armed with, 0.3 s + 0.5 s grace + 0.5 s slack, not 21 s."""
    done = subprocess.run(
        [sys.executable, "-c", HARD_LIMIT, "hang"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "Timeout (0:00:01.300000)!" in done.stderr, done.stderr
