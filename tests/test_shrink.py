"""The search's probe and ``convmatrix shrink``.

The probe judges a case through the run's own ``run_guarded`` on the run's kernel and policy:
its verdict must be the one ``convmatrix run`` records for the same case, and two failures
are told apart by what failed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from kernel_repo import BAD, cli, git, nightly, repository
from runner_helpers import KERNELS, child_env, convmatrix_cmd, runs

from convmatrix.cli import main
from convmatrix.db.database import Database
from convmatrix.db.queries import load_results, resolve_run
from convmatrix.kernels.doubles.seeded import CATALOGUE, SIZE_CATALOGUE, base_case
from convmatrix.kernels.interface.registry import load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.options import RunOptions
from convmatrix.search.probe import Probe, ProbeOutcome
from convmatrix.search.shrink import shrink, variant
from convmatrix.service.regressions import list_regressions, regression_events


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def _probe(kernel: str, **options) -> Probe:
    return Probe(RunOptions(kernel=kernel, device="cpu", reference_cache="off", **options))


def test_probe_judges_like_a_run_and_counts():
    bug = CATALOGUE["halo_off_by_one"].bug
    probe = _probe("seeded:halo_off_by_one")
    failing = probe.judge(base_case(bug.trigger))
    quiet = probe.judge(base_case(bug.quiet))
    assert failing.failed and failing.outcome == "failed" and failing.signature == "failed: y"
    assert not quiet.failed and quiet.outcome == "passed" and quiet.signature == ""
    assert probe.runs == 2 and [c.seqlen for c, _ in probe.history] == [65, 64]
    assert failing.result is not None and failing.result.outcome == "failed"


def test_probe_puts_a_case_outside_the_contract_to_the_kernel_as_an_expected_error():
    probe = _probe("tiled")
    short = base_case({"op": "update", "state_len": 2})  # S < K-1: outside docs/spec.md §2
    assert "state_len 2 < width-1" in (probe.violation(short) or "")
    got = probe.judge(short)
    assert got.outcome == "passed"  # the kernel raised its clean error
    assert probe.history[-1][0].expect == "error"


def test_same_failure_compares_outcome_exception_and_outputs():
    def outcome(signature: str) -> ProbeOutcome:
        return ProbeOutcome(bool(signature), "x", signature, 0.0)

    y_dx, dx = outcome("failed: dx,y"), outcome("failed: dx")
    assert y_dx.same_failure(dx) and dx.same_failure(y_dx)
    assert not y_dx.same_failure(outcome("failed: dw"))
    assert not y_dx.same_failure(outcome("crashed"))
    assert not outcome("failed: raised IndexError").same_failure(y_dx)
    assert not y_dx.same_failure(outcome(""))


def test_probe_uses_the_matrix_policy_and_the_rule_given():
    probe = _probe("tiled", matrix="smoke", rule="threshold")
    assert probe.context.policy.rule == "threshold"
    assert probe.workload.name == "smoke"


# -- shrink -----------------------------------------------------------------------------------


def test_a_mamba_sized_failure_of_the_1024_channel_bug_shrinks_to_its_trigger():
    """The issue's done-when: L=8192, C=1536, B=2 with bias, states and packing, down to C just
    past the bug's declared threshold, one row, at most one tile plus one token, no bias,
    states or packing, in at most 60 case runs."""
    bug = SIZE_CATALOGUE["channel_blocks_1024"].bug
    probe = _probe("seeded:channel_blocks_1024")
    big = base_case({
        "seqlen": 8192, "dim": 1536, "batch": 2, "activation": "silu",
        "initial_state": "random", "final_state": True, "seq_lens": (4096, 4096),
    })  # fmt: skip
    result = shrink(big, probe, max_runs=60)
    case, limit, tile = result.case, bug.threshold.limit, probe.geometry["tile"]
    assert result.runs <= 60 and result.runs == probe.runs
    assert case.dim == limit + 1 and result.boundaries["dim"] == (limit, limit + 1)
    assert case.batch == 1 and case.seqlen <= tile + 1
    assert not case.bias and case.initial_state == "none" and not case.final_state
    assert case.seq_lens is None and case.op == big.op and case.suite == big.suite
    assert result.outcome is not None and result.outcome.same_failure(result.failure)
    assert "passes at C=1024, fails at C=1025" in result.boundary_lines()
    # The path is every candidate run after the reproduction, kept or not.
    assert len(result.path) == result.runs - 1
    assert [s.dimension for s in result.path if s.failed][:1] == ["seqlen"]


def test_a_tile_boundary_is_found_on_the_kernel_geometry():
    probe = _probe("seeded:halo_off_by_one")
    result = shrink(base_case({"seqlen": 1000, "dim": 40, "batch": 3}), probe)
    tile = probe.geometry["tile"]
    assert result.boundaries["seqlen"] == (tile, tile + 1)
    assert (result.case.seqlen, result.case.dim, result.case.batch) == (tile + 1, 1, 1)
    snippet = result.include_snippet()
    assert f"passes at L={tile}, fails at L={tile + 1}" in snippet
    assert snippet.splitlines()[-2] == "include:" and f"seqlen: {tile + 1}" in snippet


def test_packing_scales_with_seqlen_and_stays_where_the_bug_needs_it():
    probe = _probe("seeded:packed_boundary_leak")  # needs two live sequences
    case = base_case({"seqlen": 300, "dim": 40, "batch": 2, "seq_lens": (100, 100, 100)})
    result = shrink(case, probe)
    shrunk = result.case
    assert shrunk.seq_lens is not None and sum(shrunk.seq_lens) == shrunk.seqlen
    assert len(shrunk.seq_lens) >= 2 and shrunk.seqlen <= 3
    assert result.boundaries["packing"][0] is None  # no packing passes


def test_a_shrink_does_not_slide_to_another_bug(monkeypatch):
    """``search_kernels:TwoBugs``: y is wrong past 64 tokens (A), dw at 2 tokens or fewer (B).
    Shrinking a failure of A walks the length down through B's trigger: the candidate at
    L=1 fails, but with B (dw, not y), so it is dropped and the shrink ends at A's own
    boundary, failing the way the original did."""
    monkeypatch.syspath_prepend(str(KERNELS))
    from search_kernels import LONG, SHORT

    probe = _probe("search_kernels:TwoBugs")
    case = base_case({"seqlen": 200, "dim": 40, "batch": 2})
    assert probe.judge(case).signature == "failed: y"  # A
    assert probe.judge(variant(case, seqlen=SHORT)).signature == "failed: dw"  # B, on the way
    result = shrink(case, probe)
    assert result.outcome is not None and result.outcome.signature == "failed: y"
    assert result.case.seqlen == LONG + 1 and result.boundaries["seqlen"] == (LONG, LONG + 1)
    slid = [s for s in result.path if s.dimension == "seqlen" and s.after <= SHORT]
    assert slid and all(s.outcome == "failed" and not s.failed for s in slid)  # B: dropped


def test_the_budget_bounds_the_runs_and_a_passing_case_stays():
    probe = _probe("seeded:halo_off_by_one")
    result = shrink(base_case({"seqlen": 1000, "dim": 40}), probe, max_runs=3)
    assert result.runs == 3 and result.exhausted
    quiet = base_case({"seqlen": 64})
    same = shrink(quiet, probe)
    assert same.case == quiet and same.runs == 1 and not same.path
    with pytest.raises(ValueError, match="max_runs 0"):
        shrink(quiet, probe, max_runs=0)


def test_dtypes_go_to_float32_only_where_the_failure_stays():
    # x_cast_to_weight_dtype shows only when x is wider than the weights: float32 x and
    # weights pass, so the dtypes must stay as they are.
    probe = _probe("seeded:x_cast_to_weight_dtype")
    case = base_case({"x_dtype": "float32", "w_dtype": "bfloat16", "seqlen": 100})
    result = shrink(case, probe)
    assert (result.case.x_dtype, result.case.w_dtype) == ("float32", "bfloat16")
    assert result.boundaries["dtype"] == ("float32/float32", "float32/bfloat16")
    # halo_off_by_one shows at any dtype: the dtypes go to float32.
    half = base_case({"x_dtype": "bfloat16", "w_dtype": "bfloat16", "seqlen": 65})
    assert shrink(half, _probe("seeded:halo_off_by_one")).case.x_dtype == "float32"


# -- convmatrix shrink and run --shrink, end to end on a real SQLite file ----------------------

TINY = """name: tiny
seed: 0
suites:
  fwd_bwd:
    op: fwd_bwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [8, 200]
      dim: [40]
      batch: [2]
      bias: [true]
"""


def _tiny_run(tmp_path: Path, *extra: str) -> str:
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(TINY)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    argv = ["run", "--matrix", str(matrix), "--kernel", "seeded:halo_off_by_one", "-n", "0",
            "--device", "cpu", "--db", db, "--reference-cache", "off", *extra]  # fmt: skip
    assert main(argv) == 1
    return db


def _failing_case(db: str) -> tuple[int, str]:
    with Database(db, existing=True) as database, database.reading() as session:
        run = resolve_run(session, "latest")
        [bad] = [r for r in load_results(session, run.id) if r.outcome == "failed"]
    return run.id, bad.case.id


def test_shrink_command_prints_json_writes_a_matrix_records_and_attaches(tmp_path, capsys):
    db = _tiny_run(tmp_path)
    run_id, case_id = _failing_case(db)
    capsys.readouterr()
    out = tmp_path / "shrunk.yaml"
    argv = ["shrink", "latest", case_id[:8], "--db", db, "--out", str(out), "--format", "json",
            "--in-process"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    tile = load("tiled").capabilities.geometry.time_tile
    assert got["case"]["seqlen"] == tile + 1 and got["case"]["dim"] == 1
    assert got["case"]["bias"] is False and got["case"]["op"] == "fwd_bwd"
    assert got["runs"] == len(got["path"]) + 1 <= 60 and got["from_case"] == case_id
    assert {"dimension", "from", "to", "failed"} <= set(got["path"][0])
    assert got["boundaries"]["seqlen"] == [tile, tile + 1]
    # The matrix file expands to the shrunk case itself.
    [case] = expand_matrix(load_matrix(str(out)), load("tiled")).cases
    assert case.id == got["case_id"]
    # Recorded as a run of kind shrink; an event on the case's open regression.
    with Database(db, existing=True) as database, database.session() as session:
        recorded = resolve_run(session, got["recorded_run"])
        [result] = load_results(session, recorded.id)
        [regression] = list_regressions(session, case_id=case_id)
        events = regression_events(session, regression.id)
    assert recorded.kind == "shrink" and result.case.id == case.id and result.outcome == "failed"
    assert got["regressions"] == [regression.id] and regression.first_bad_run == run_id
    assert events[-1].by == "convmatrix shrink" and case.id in (events[-1].note or "")
    assert events[-1].run_id == recorded.id
    # latest still names the plain run, not the shrink's.
    with Database(db, existing=True) as database, database.reading() as session:
        assert resolve_run(session, "latest").id == run_id


def test_shrink_command_text_and_usage_errors(tmp_path, capsys):
    db = _tiny_run(tmp_path)
    _, case_id = _failing_case(db)
    capsys.readouterr()
    argv = ["shrink", "latest", case_id, "--db", db, "--out", str(tmp_path / "s.yaml"),
            "--no-record", "--max-runs", "8", "--in-process"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "in 8 case runs, budget spent" in text and "1. seqlen: 200 -> 1  passed" in text
    assert "include:\n  - {width: 4" in text and "recorded as run" not in text
    with Database(db, existing=True) as database, database.reading() as session:
        passing = [r.case.id for r in load_results(session, 1) if r.outcome == "passed"]
    assert main(["shrink", "latest", passing[0], "--db", db]) == 2
    assert "passed in run 1: only a failing case shrinks" in capsys.readouterr().err
    assert main(["shrink", "latest", "feedbeef", "--db", db]) == 2
    assert "CASE 'feedbeef': no such case in run 1" in capsys.readouterr().err
    assert main(["shrink", "latest", case_id, "--db", db, "--max-runs", "0"]) == 2
    # An --out that cannot be written is refused before any work (no run of kind shrink).
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = blocker / "shrunk" / "s.yaml"
    assert main(["shrink", "latest", case_id, "--db", db, "--out", str(unwritable)]) == 2
    assert f"--out {unwritable}: {blocker} is a file" in capsys.readouterr().err
    with Database(db, existing=True) as database, database.reading() as session:
        assert resolve_run(session, "latest").id == 1  # nothing recorded


def test_run_shrink_shrinks_the_new_failures(tmp_path, capsys):
    _tiny_run(tmp_path, "--shrink", "30")
    out = capsys.readouterr().out
    tile = load("tiled").capabilities.geometry.time_tile
    assert f"passes at L={tile}, fails at L={tile + 1}" in out
    assert "recorded as run 2; attached to regression #1" in out


# -- the code a shrink runs, and stopping it -------------------------------------------------


def test_shrink_holds_to_the_recorded_commit_and_checkout_shrinks_it(tmp_path):
    """The run tested commit ``bad``: from the ``good`` checkout, or from ``bad`` with local
    changes, ``shrink`` refuses before any work (exit 2, both commits named, nothing written
    or recorded); with ``--checkout`` it shrinks ``bad`` as committed from a temporary
    worktree and records the commit it ran."""
    repo, good, bad = repository(tmp_path)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    broken = nightly(repo, bad, url)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    with Database(url, existing=True) as database, database.reading() as session:
        [failing] = [r.case.id for r in load_results(session, 1) if r.outcome == "failed"]
    out = tmp_path / "shrunk.yaml"
    argv = ["shrink", "1", failing, "--db", url, "--out", str(out), "--in-process"]

    git(repo, "checkout", "-q", good)
    elsewhere = cli(repo, *argv)
    assert elsewhere.returncode == 2, elsewhere.stdout + elsewhere.stderr
    assert f"tested kernel commit {bad}" in elsewhere.stderr and f"is at {good}" in elsewhere.stderr
    git(repo, "checkout", "-q", bad)
    (repo / "repok.py").write_text(BAD + "# a local change\n")
    dirty = cli(repo, *argv)
    assert dirty.returncode == 2 and f"at {bad} with local changes" in dirty.stderr, dirty.stderr
    assert not out.exists() and len(runs(url)) == 1

    git(repo, "checkout", "-q", "--", "repok.py")
    git(repo, "checkout", "-q", good)
    done = cli(repo, *argv, "--checkout", "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout)
    tile = load("tiled").capabilities.geometry.time_tile
    assert got["case"]["seqlen"] == tile + 1 and out.exists()
    recorded = runs(url)[-1]
    assert (recorded.kind, recorded.kernel, recorded.kernel_commit) == ("shrink", "repok", bad)


@pytest.mark.parametrize("where", ["isolated", "in-process"])
def test_sigterm_keeps_records_and_writes_the_smallest_case_so_far(tmp_path, where):
    """A shrink of a slow kernel gets SIGTERM once its walk has kept a candidate (the second
    candidate is running: L 200 -> 1 kept, then C 40 -> 1): it stops within seconds, exit
    130, and what it found so far (a smaller case failing the same way) is written to --out
    and recorded as a run of kind shrink."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(TINY)
    kernel = "search_kernels:SlowReversedTaps"
    made = subprocess.run(
        convmatrix_cmd("run", "--matrix", str(matrix), "--kernel", kernel, "-n", "0",
                       "--device", "cpu", "--db", db),
        env=child_env(SLOW_S="0"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 1, made.stdout + made.stderr
    with Database(db, existing=True) as database, database.reading() as session:
        [long] = [r.case for r in load_results(session, 1) if r.case.seqlen == 200]
    calls, out = tmp_path / "calls.log", tmp_path / "shrunk.yaml"
    argv = ["shrink", "1", long.id, "--db", db, "--out", str(out)]
    argv += ["--in-process"] if where == "in-process" else []
    shrinking = subprocess.Popen(
        convmatrix_cmd(*argv), env=child_env(SLOW_S="0.3", CALLS_LOG=str(calls)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and shrinking.poll() is None:
            called = set(calls.read_text().split()) if calls.exists() else set()
            if called - {"200,40", "1,40"}:  # the second candidate runs: the first was kept
                break
            time.sleep(0.2)
        sent = time.monotonic()
        shrinking.send_signal(signal.SIGTERM)
        stdout, stderr = shrinking.communicate(timeout=60)
        stopped_s = time.monotonic() - sent
    finally:
        shrinking.kill()
    assert shrinking.returncode == 130, stdout + stderr
    assert stopped_s < 10, stopped_s
    assert ", interrupted:" in stdout, stdout
    [case] = expand_matrix(load_matrix(str(out)), load("tiled")).cases
    assert case.seqlen < long.seqlen and case.op == long.op
    recorded = runs(db)[-1]
    assert recorded.kind == "shrink" and recorded.n_results == 1
