"""Progress lines of long runs: what a line says, when lines come, and a real run printing them."""

from __future__ import annotations

import io

import pytest
from db_fixtures import fake_case
from runner_helpers import TINY, convmatrix_cmd, run

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult
from convmatrix.runners.run.progress import (
    CI_INTERVAL_S,
    TTY_INTERVAL_S,
    Progress,
    default_interval,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def result(i: int, outcome: str, host: str, index: int, retries: int = 0) -> CaseResult:
    return CaseResult(fake_case(i), outcome, host=host, device_index=index, retries=retries)


def test_a_line_every_interval_with_counts_rate_eta_and_devices():
    clock, out = Clock(), io.StringIO()
    progress = Progress(10, interval_s=5, stream=out, clock=clock)
    for i, (outcome, host, index) in enumerate(
        [("passed", "a", 0), ("failed", "a", 1), ("passed", "b", 0), ("crashed", "a", 0)]
    ):
        clock.now += 2.0  # one result every 2 s
        progress.update(result(i, outcome, host, index, retries=int(outcome == "crashed")))
    lines = out.getvalue().splitlines()
    # Results at 2, 4, 6, 8 s: a line at 6 s (>= 5 s after the start), none at 8 s.
    assert lines == ["progress: 3/10 (30%), 1 failing, 0.50 cases/s, ETA 14 s; a:0 1, a:1 1, b:0 1"]
    assert progress.line() == (
        "progress: 4/10 (40%), 2 failing, 0.50 cases/s, ETA 12 s, 1 retries; a:0 2, a:1 1, b:0 1"
    )


def test_quiet_under_ci_or_off_a_terminal_unless_told():
    assert default_interval(Terminal(), {}) == TTY_INTERVAL_S
    assert default_interval(Terminal(), {"CI": "true"}) == CI_INTERVAL_S
    assert default_interval(io.StringIO(), {}) == CI_INTERVAL_S
    assert default_interval(io.StringIO(), {"CONVMATRIX_PROGRESS_S": "2.5"}) == 2.5
    with pytest.raises(UsageError, match="CONVMATRIX_PROGRESS_S='soon'"):
        default_interval(io.StringIO(), {"CONVMATRIX_PROGRESS_S": "soon"})


def test_a_real_run_prints_progress_lines_on_stderr(tmp_path):
    done = run(
        convmatrix_cmd("run", "--matrix", str(TINY), "--kernel", "torch", "--no-db", "-n", "0"),
        tmp_path,
        CONVMATRIX_PROGRESS_S="0.000001",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("progress:")]
    assert [line.split(",")[0] for line in lines] == [
        f"progress: {i}/4 ({25 * i}%)" for i in (1, 2, 3, 4)
    ]
    assert all("0 failing" in line and "ETA" in line for line in lines)
