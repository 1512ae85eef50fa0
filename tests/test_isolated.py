"""Cases in a child process (``runners.executors.isolated``), as the Ray executor's device actors
run them: real spawned processes, a kernel that aborts its process, one that hangs."""

from __future__ import annotations

import torch
from runner_helpers import KERNELS, TINY, TINY_L7

from convmatrix.runners.case.execute import run_guarded
from convmatrix.runners.executors.isolated import ChildSpec, IsolatedRunner
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import Setup
from convmatrix.runners.run.store import MemoryStore


def runner_for(kernel: str, monkeypatch) -> tuple[IsolatedRunner, Setup]:
    monkeypatch.syspath_prepend(str(KERNELS))  # spawned children get this sys.path too
    options = RunOptions(matrix=str(TINY), kernel=kernel, device="cpu", workers=0)
    setup = Setup.of(options.checked(), MemoryStore())
    spec = ChildSpec(setup.prepared.handover(), "cpu", None, threads=1)
    return IsolatedRunner(spec), setup


def cases(setup: Setup):
    source = setup.prepared.sources[0]
    return source, setup.prepared.workload(source).cases


def test_a_kernel_that_aborts_is_one_crashed_case_and_the_next_gets_a_fresh_child(monkeypatch):
    runner, setup = runner_for("bad_kernels:AbortsOnOneCase", monkeypatch)
    source, tiny = cases(setup)
    try:
        outcomes = {c.pytest_id: runner.run(source, c, 60.0) for c in tiny}
    finally:
        runner.close()
    crashed = outcomes.pop(TINY_L7)
    assert crashed.outcome == "crashed"
    assert "died while running this case (killed by signal SIGABRT)" in crashed.message
    assert {r.outcome for r in outcomes.values()} == {"passed"}
    assert runner.started == 2  # the crash cost one child, not the runner


def test_a_child_result_is_the_in_process_result(monkeypatch):
    runner, setup = runner_for("torch", monkeypatch)
    source, tiny = cases(setup)
    case = next(c for c in tiny if c.op == "fwd_bwd")
    try:
        child = runner.run(source, case, 60.0)
    finally:
        runner.close()
    torch.set_num_threads(1)  # as the child's
    local = run_guarded(case, setup.prepared.context(setup.prepared.workload(source)))
    assert child.outcome == local.outcome == "passed"
    assert [(o.output, o.e_abs, o.e_rel, o.e_norm) for o in child.outputs] == [
        (o.output, o.e_abs, o.e_rel, o.e_norm) for o in local.outputs
    ]


def test_a_hung_case_is_a_timeout_and_its_child_is_killed(monkeypatch):
    runner, setup = runner_for("bad_kernels:HangsOnOneCase", monkeypatch)
    source, tiny = cases(setup)
    hung = next(c for c in tiny if c.pytest_id == TINY_L7)
    other = next(c for c in tiny if c.pytest_id != TINY_L7 and c.op == "fwd_bwd")
    try:
        result = runner.run(source, hung, 3.0)
        after = runner.run(source, other, 60.0)
    finally:
        runner.close()
    assert result.outcome == "timeout" and "no result after 3 s" in result.message
    assert after.outcome == "passed" and runner.started == 2


def test_a_child_asked_to_stop_ends_without_running_its_kernels_hooks(monkeypatch, tmp_path):
    """It ends as an xdist worker does (core.ending): no interpreter teardown (0.55 s with
    torch) while the actor's close waits on it, and no atexit hook a kernel left."""
    mark = tmp_path / "hook-ran"
    monkeypatch.setenv("HOSTILE_HOOK_MARK", str(mark))  # the spawned child inherits it
    runner, setup = runner_for("hostile_kernels:LeavesAHook", monkeypatch)
    source, tiny = cases(setup)
    try:
        assert runner.run(source, tiny[0], 60.0).outcome == "passed"
        process = runner._process
    finally:
        runner.close()
    assert process.exitcode == 0  # it stopped when asked, not killed after the 5 s wait
    assert not mark.exists()
