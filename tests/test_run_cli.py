"""``convmatrix run`` end to end: real processes, real xdist workers, real databases."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from runner_helpers import (
    RESOURCES,
    TINY,
    child_env,
    convmatrix_cmd,
    results,
    run,
    runs,
)
from sqlalchemy import create_engine, text

from convmatrix.cli import main
from convmatrix.core.recorded import Recorded
from convmatrix.db import open_database

RESUME = RESOURCES / "matrices" / "resume.matrix.yaml"


@pytest.mark.parametrize("kernel", ["torch", "reference"])
@pytest.mark.slow
def test_smoke_passes_under_two_workers_and_every_case_is_stored(tmp_path, kernel):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["run", "--matrix", "smoke", "--kernel", kernel, "-n", "2", "--db", url]
    done = run(convmatrix_cmd(*args, "--report", str(tmp_path / "report")), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = runs(url)
    assert f"convmatrix run {info.id} [finished]: {info.n_planned} passed" in done.stdout
    assert info.status == "finished" and info.counts["passed"] == info.n_planned > 20
    assert info.kernel == kernel and info.matrix == "smoke"
    assert len(info.kernel_commit) == 40 and info.kernel_dirty in (True, False)  # git HEAD
    stored = results(url, info.id)
    assert len(stored) == info.n_planned
    judged = [r for r in stored if r.case.expect == "ok"]
    assert all(r.outputs and all(o.passed for o in r.outputs) for r in judged)
    assert {r.worker for r in stored} <= {"gw0", "gw1"}
    assert (tmp_path / "report" / f"run-{info.id}.html").is_file()


@pytest.mark.slow
def test_reversed_weight_taps_fail_exactly_the_outputs_that_depend_on_weights(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["run", "--matrix", str(TINY), "--kernel", "bad_kernels:ReversedTaps", "-n", "2"]
    done = run(convmatrix_cmd(*args, "--db", url), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worst 4 of 4 failures:" in done.stdout
    (info,) = runs(url)
    failing = {}
    for r in results(url, info.id):
        assert r.outcome == "failed"
        failing[r.case.op] = ({o.output for o in r.outputs if not o.passed},
                              {o.output for o in r.outputs if o.passed})  # fmt: skip
    # y, dx, dw, dS go through the weights, and db too under SiLU; F and the decode state
    # are copies of the inputs.
    assert failing["fwd_bwd"] == ({"y", "dx", "dw", "db", "dS"}, {"F"})
    assert failing["update"] == ({"y"}, {"state"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--matrix", "smoke", "--kernel", "nope"], "--kernel: unknown kernel 'nope'"),
        (["--matrix", "nosuch", "--kernel", "torch"], "nosuch"),
        (["--matrix", "smoke", "--kernel", "torch", "-n", "many"], "-n 'many'"),
        (["--matrix", "smoke", "--kernel", "torch", "--case", "zzzz"], "--case zzzz: no such"),
        (["--matrix", "smoke", "--kernel", "torch", "--device", "tpu"], "--device 'tpu'"),
        (["--kernel", "torch"], "--matrix and --kernel are required"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(argv, message, tmp_path, capsys):
    assert main(["run", *argv, "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("convmatrix run: error:") and message in err


def test_a_malformed_matrix_file_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.matrix.yaml"
    bad.write_text("name: bad\nsuites:\n  s:\n    op: fwd\n    dimensions:\n      width: [two]\n")
    assert main(["run", "--matrix", str(bad), "--kernel", "torch", "--no-db"]) == 2
    err = capsys.readouterr().err
    assert "bad.matrix.yaml:6" in err


def test_resume_of_an_unknown_run_lists_what_exists(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["run", "--resume", "42", "--db", url]) == 2  # no file: not created
    assert "x.db does not exist" in capsys.readouterr().err  # the one rule, every command
    assert not (tmp_path / "x.db").exists()
    open_database(url).dispose()  # an empty database: the run is looked up and not found
    assert main(["run", "--resume", "42", "--db", url]) == 2
    assert "run '42' matches no run" in capsys.readouterr().err


def _start(tmp_path, url: str, *extra: str) -> subprocess.Popen:
    """A slow run (0.4 s per case, one worker) in its own process group."""
    args = ["run", "--matrix", str(RESUME), "--kernel", "bad_kernels:Slow", "-n", "1"]
    return subprocess.Popen(
        convmatrix_cmd(*args, "--db", url, *extra),
        cwd=tmp_path,
        env=child_env(SLOW_S="0.4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _stored(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM cases")).scalar_one()
    except Exception:  # the schema may not exist yet
        return 0
    finally:
        engine.dispose()


def _wait_for(url: str, proc: subprocess.Popen, at_least: int) -> None:
    deadline = time.monotonic() + 240
    while _stored(url) < at_least:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the run recorded nothing"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_run_keeps_its_results_and_resume_runs_only_the_missing(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    proc = _start(tmp_path, url)
    _wait_for(url, proc, at_least=2)
    os.killpg(proc.pid, signal.SIGKILL)  # the nightly job killed: no chance to clean up
    proc.wait(timeout=60)
    before = _stored(url)
    assert 2 <= before < 16
    (info,) = runs(url)
    assert info.status == "running"  # nobody could say otherwise

    # A test file in the working directory is not part of the run (it would fail if collected).
    (tmp_path / "test_decoy.py").write_text("def test_decoy():\n    assert False\n")
    done = run(convmatrix_cmd("run", "--resume", str(info.id), "--db", url, "-n", "1"), tmp_path,
               SLOW_S="0")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"this session: {16 - before} passed" in done.stdout
    assert f"\n{16 - before} passed in" in done.stdout  # pytest ran only the missing cases
    (info,) = runs(url)
    assert info.status == "finished" and info.counts["passed"] == 16
    assert len({r.case.id for r in results(url, info.id)}) == 16


@pytest.mark.slow
def test_sigterm_marks_the_run_interrupted_and_keeps_what_was_recorded(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    proc = _start(tmp_path, url)
    _wait_for(url, proc, at_least=1)
    os.kill(proc.pid, signal.SIGTERM)  # the controller only, as a job scheduler does
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    (info,) = runs(url)
    assert info.status == "interrupted"
    assert 1 <= info.n_results < 16 and info.n_results == _stored(url)
    assert re.search(rf"convmatrix run {info.id} \[interrupted\]: \d+ passed", out), out


@pytest.mark.slow
def test_two_runs_writing_one_database_at_once_lose_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    procs = [
        subprocess.Popen(
            convmatrix_cmd("run", "--matrix", str(RESUME), "--kernel", "torch", "-n", "1",
                           "--db", url, "--label", label),
            cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        for label in ("first", "second")
    ]  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    stored = runs(url)
    assert sorted(r.label for r in stored) == ["first", "second"]
    for info in stored:
        assert info.status == "finished" and info.counts["passed"] == 16
        assert len(results(url, info.id)) == 16


@pytest.mark.postgres
def test_run_into_postgresql(tmp_path, postgres_url):
    args = ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "2", "--label", "pg"]
    done = run(convmatrix_cmd(*args, "--commit", "0123abcd", "--db", postgres_url), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = runs(postgres_url)
    assert (info.label, info.status, info.counts["passed"]) == ("pg", "finished", 4)
    assert (info.kernel_commit, info.kernel_dirty) == ("0123abcd", None)  # --commit wins
    assert {r.worker for r in results(postgres_url, info.id)} <= {"gw0", "gw1"}


def test_a_run_records_the_arithmetic_its_kernel_declares(tmp_path):
    """The bound, so the usage, follows the declaration: the run keeps it, and the diff
    compares usage only between runs that declare the same (compare.errors)."""
    from convmatrix.api import run as run_api
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.run.workload import load_workload

    url = f"sqlite:///{tmp_path / 'results.db'}"
    spec = "convmatrix.kernels.doubles.variants:ShuffledSums"
    case = next(c for c in load_workload("smoke", load(spec)).cases if c.expect == "ok")
    run_api("smoke", spec, workers=0, db=url, cases=[case.id])
    run_api("smoke", "torch", workers=0, db=url, cases=[case.id])
    shuffled, torch_path = sorted(runs(url), key=lambda info: info.id)
    assert Recorded.of(shuffled.options).arithmetic == {
        "accumulate": "float32", "intermediate": "fp32", "deterministic": False,
    }  # fmt: skip
    assert Recorded.of(torch_path.options).arithmetic == {
        "accumulate": "float32", "intermediate": "input", "deterministic": True,
    }  # fmt: skip
