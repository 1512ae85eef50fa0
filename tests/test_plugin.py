"""The pytest plugin in real pytest processes: xdist workers, crashes, timeouts, the writer.

PostgreSQL under xdist is covered by ``test_run_cli.py::test_run_into_postgresql``.
"""

from __future__ import annotations

import subprocess

import pytest
from runner_helpers import TINY, TINY_L7, child_env, pytest_cmd, results, run, runs, tiny_copy
from sqlalchemy import create_engine, text

from convmatrix.core.errors import NotJudgedError
from convmatrix.matrix import expand_matrix, load_matrix


def by_id(url: str, run_id: int) -> dict:
    return {r.case.pytest_id: r for r in results(url, run_id)}


@pytest.mark.slow
def test_xdist_run_records_every_case_and_only_the_controller_writes(tmp_path):
    """Under -n 2 every case lands in the database, written by the controller alone.

    The kernel is ``DbSpy``: in each worker, at every call, it looks through its own open
    files for the database and raises if it finds it. The same spy in a single process (the
    writer itself) fails, which shows the spy can see the file at all.
    """
    db = tmp_path / "results.db"
    url = f"sqlite:///{db}"
    cmd = pytest_cmd(
        tiny_copy(tmp_path), "--kernel", "bad_kernels:DbSpy", "--db", url, "-n", "2", "-v"
    )
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=child_env(CONVMATRIX_SPY_DB=str(db)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    (info,) = runs(url)
    engine = create_engine(url)
    with engine.connect() as conn:  # the run row names its writer: the pytest process itself
        assert conn.execute(text("SELECT pid FROM runs")).scalar_one() == proc.pid
    engine.dispose()
    assert (info.status, info.n_planned, info.counts["passed"]) == ("finished", 4, 4)
    stored = by_id(url, info.id)
    expected = {c.pytest_id for c in expand_matrix(load_matrix(str(TINY))).cases}
    assert set(stored) == expected
    assert {r.worker for r in stored.values()} <= {"gw0", "gw1"}
    assert all(r.outputs for r in stored.values())
    assert info.options["workers"] == 2
    # Readable ids: matrix file :: the case's pytest id.
    assert f"PASSED tiny.matrix.yaml::{TINY_L7}" in out
    assert f"convmatrix run {info.id} [finished]: 4 passed" in out

    single = run(
        pytest_cmd(TINY.name, "--kernel", "bad_kernels:DbSpy", "--db", url, "-q"),
        tmp_path,
        CONVMATRIX_SPY_DB=str(db),
    )
    assert single.returncode == 1
    assert "holds the database open" in single.stdout


@pytest.mark.slow
def test_a_worker_killed_by_its_kernel_is_one_crashed_case(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    done = run(
        pytest_cmd(str(TINY), "--kernel", "bad_kernels:AbortsOnOneCase", "--db", url, "-n", "2"),
        tmp_path,
    )
    assert done.returncode == 1, done.stdout
    (info,) = runs(url)
    stored = by_id(url, info.id)
    assert len(stored) == 4 and info.status == "finished"
    assert {k: r.outcome for k, r in stored.items() if r.outcome != "passed"} == {
        TINY_L7: "crashed"
    }
    assert "died while running this case" in stored[TINY_L7].message
    assert "1 worker(s) died and were replaced" in done.stdout


@pytest.mark.slow
def test_a_hung_kernel_is_a_timeout_recorded_once_and_the_run_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    # 10 s: an honest tiny case takes ~0.02 s, ~2 s when it is a cold worker's first on a
    # loaded machine; the hung one sleeps an hour.
    args = ["--kernel", "bad_kernels:HangsOnOneCase", "--db", url, "-n", "2"]
    args += ["--case-timeout", "10"]
    done = run(pytest_cmd(str(TINY), *args), tmp_path)
    assert done.returncode == 1, done.stdout
    (info,) = runs(url)
    assert (info.counts["timeout"], info.counts["crashed"], info.counts["passed"]) == (1, 0, 3)
    stored = by_id(url, info.id)
    assert stored[TINY_L7].outcome == "timeout"
    assert "no result after 10 s" in stored[TINY_L7].message


@pytest.mark.slow
def test_plain_pytest_selects_cases_and_skips_with_reasons(tmp_path):
    """No xdist: one process runs and records; --case selects; missing features skip."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cases = expand_matrix(load_matrix(str(TINY))).cases
    update = next(c for c in cases if c.op == "update")
    fwd = [c for c in cases if c.op == "fwd_bwd"]
    args = ["--matrix", str(TINY), "--kernel", "bad_kernels:ForwardOnly", "--db", url, "-rs"]
    args += ["--case", update.id[:6], "--case", fwd[0].pytest_id]
    done = run(pytest_cmd(*args), tmp_path)
    assert done.returncode == 0, done.stdout
    # only the named cases become items (issue 32): nothing to deselect
    assert "1 passed, 1 skipped in" in done.stdout and "deselected" not in done.stdout
    assert "lacks feature(s) backward" in done.stdout
    (info,) = runs(url)
    stored = {r.case.id: r for r in results(url, info.id)}
    assert {k: r.outcome for k, r in stored.items()} == {update.id: "passed", fwd[0].id: "skipped"}
    assert stored[update.id].worker == "main" and info.n_planned == 2


def test_plain_pytest_that_judged_nothing_is_not_green(tmp_path):
    """Every selected case skipped (the kernel lacks what they need): pytest alone would say
    0; ``pytest --matrix`` ends with convmatrix's "nothing judged" status instead."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cases = expand_matrix(load_matrix(str(TINY))).cases
    fwd = [c for c in cases if c.op == "fwd_bwd"]
    args = ["--matrix", str(TINY), "--kernel", "bad_kernels:ForwardOnly", "--db", url]
    done = run(pytest_cmd(*args, "--case", fwd[0].pytest_id), tmp_path)
    assert done.returncode == NotJudgedError.exit_code, done.stdout + done.stderr
    assert "1 skipped" in done.stdout


def test_usage_errors_and_staying_out_of_ordinary_suites(tmp_path):
    bad = run(pytest_cmd("--matrix", "smoke", "--kernel", "nope", "--no-db"), tmp_path)
    assert bad.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--kernel: unknown kernel 'nope'" in bad.stderr
    # Without --kernel a directory holding matrix files collects nothing from them.
    quiet = run(pytest_cmd(str(TINY.parent), "--co", "-q"), tmp_path)
    assert quiet.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, quiet.stdout
