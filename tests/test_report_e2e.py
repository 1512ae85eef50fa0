"""End to end through the real CLI: ``convmatrix run`` writes two runs of a small matrix (the
correct ``torch`` kernel, then one with a seeded tile+1/channel-last bug) into a SQLite file;
``report``, ``diff`` and ``history`` read them back. The runs and the diff gate are real
subprocesses (exit codes as CI sees them); the other reads call the same ``main(argv)``
in-process, since each process start costs seconds of torch import."""

from __future__ import annotations

import json

import pytest
from runner_helpers import RESOURCES, convmatrix_cmd, results, run

from convmatrix.cli import main

MATRIX = RESOURCES / "matrices" / "report.matrix.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs_db(tmp_path_factory):
    """Run 1: torch (correct); run 2: report_kernels:TailBug. Returns (cwd, url, bug ids)."""
    cwd = tmp_path_factory.mktemp("e2e")
    url = f"sqlite:///{cwd / 'results.db'}"
    base = ["run", "--matrix", str(MATRIX), "-n", "0", "--db", url]
    good = run(convmatrix_cmd(*base, "--kernel", "torch", "--commit", "a" * 40), cwd)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run(
        convmatrix_cmd(*base, "--kernel", "report_kernels:TailBug", "--commit", "b" * 40,
                       "--report", str(cwd / "nightly")),
        cwd,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    stored = results(url, 2)
    bug = {r.case.id for r in stored if r.case.seqlen == 9 and r.case.layout == "channel_last"}
    assert len(bug) == 2  # K=3 and K=4
    return cwd, url, bug


def test_run_report_written_by_run_shows_the_bug_in_its_corner(runs_db):
    cwd, _, bug = runs_db
    data = json.loads((cwd / "nightly" / "run-2.json").read_text())
    assert {f["case_id"] for f in data["failures"]} == bug
    assert all(f["rerun"].endswith(f"--case {f['case_id']}") for f in data["failures"])
    assert "--kernel report_kernels:TailBug" in data["failures"][0]["rerun"]
    pivot = next(p for p in data["pivots"] if p["dims"] == ["seqlen", "layout"])
    rates = {tuple(r["key"]): r["pass_rate"] for r in pivot["rows"]}
    assert rates.pop(("tile+1", "channel_last")) == 0.0
    assert set(rates.values()) == {1.0}


def test_report_command_on_the_runs(runs_db, capsys):
    cwd, url, _ = runs_db
    assert main(["report", "1", "--db", url, "--out", str(cwd / "r")]) == 0
    assert "PASSED torch @ aaaaaaaaaa (run 1): 12 passed" in capsys.readouterr().out
    assert (cwd / "r" / "run-1.html").exists()


def test_diff_of_correct_and_seeded_bug_fails_the_gate(runs_db):
    cwd, url, bug = runs_db
    out = cwd / "diff.html"
    cmd = convmatrix_cmd(
        "diff", "1", "2", "--db", url, "--out", str(out), "--fail-on", "new-failures"
    )
    done = run(cmd, cwd)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "new failures: 2" in done.stdout
    data = json.loads(out.with_suffix(".json").read_text())
    assert {c["case_id"] for c in data["new_failures"]} == bug
    assert {e["case_id"] for e in data["error_regressions"]} == bug


def test_diff_of_a_run_with_itself_is_empty(runs_db, capsys):
    _, url, _ = runs_db
    assert main(["diff", "2", "2", "--db", url, "--fail-on", "new-failures"]) == 0
    assert "no changes" in capsys.readouterr().out


def test_history_of_float32_over_both_runs(runs_db, capsys):
    _, url, _ = runs_db
    assert main(["history", "--dtype", "fp32", "--format", "json", "--db", url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["failing"], r["cases"]) for r in data["runs"]] == [
        (1, False, 12),
        (2, True, 12),
    ]
    assert data["runs"][1]["outputs"]["y"]["worst_rel"] == pytest.approx(0.5, rel=1e-6)
