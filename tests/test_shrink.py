"""The search's probe and ``convmatrix shrink``.

The probe judges a case through the run's own ``run_guarded`` on the run's kernel and policy:
its verdict must be the one ``convmatrix run`` records for the same case, and two failures
are told apart by what failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from convmatrix.cli import main
from convmatrix.db.database import Database
from convmatrix.db.queries import load_results, resolve_run
from convmatrix.kernels.doubles.seeded import CATALOGUE, SIZE_CATALOGUE, base_case
from convmatrix.kernels.interface.registry import load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.options import RunOptions
from convmatrix.search.probe import Probe, ProbeOutcome
from convmatrix.search.shrink import shrink
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


def test_run_shrink_shrinks_the_new_failures(tmp_path, capsys):
    _tiny_run(tmp_path, "--shrink", "30")
    out = capsys.readouterr().out
    tile = load("tiled").capabilities.geometry.time_tile
    assert f"passes at L={tile}, fails at L={tile + 1}" in out
    assert "recorded as run 2; attached to regression #1" in out
