"""The device check's dry run (benchmarks/device_check.py --dry-run): the script a GPU machine
runs, on this CPU at small sizes, end to end: every step runs, the built-in kernels pass, the
summary holds each run's counts and phases. (The wheel folder it carries is downloaded by
``nox -s device``; the suite does not reach PyPI.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runner_helpers import child_env

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "device_check.py"


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_writes_its_summary(tmp_path):
    out = tmp_path / "check"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--budget-s", "500"],
        env=child_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["dry_run"] is True
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["selfcheck"]["exit_code"] == 0
    assert "reference on cpu == on the host" in steps["selfcheck"]["tail"]
    for kernel in ("torch", "tiled"):
        smoke = steps[f"device-check smoke {kernel}"]
        assert smoke["exit_code"] == 0 and smoke["counts"].get("passed", 0) > 0
        assert set(smoke["counts"]) <= {"passed", "skipped"}
    production = steps["device-check production torch"]
    assert production["counts"] == {"passed": 1}
    assert production["elements"] > 2**20  # a Mamba-sized case
    assert {"kernel", "reference", "metrics"} <= set(production["phases"])
    assert steps["device-check perf tiled"]["phases"].get("timing", 0) > 0
    assert "<table" in (out / "summary.html").read_text()
    assert list((out / "reports").glob("run-*.html"))
