"""``convmatrix explore``: drawing from the whole space, and the search on real engines.

Drawing (``search.space``) is checked for what a search relies on: the same seed draws the
same cases; every drawn case is one the matrix language builds (its include entry expands to
the same id) and the kernel's declared contract accepts, within ``--max-elements``; draws sit
on tile and power-of-two boundaries far more often than unbiased log-uniform draws do, and on
the edges of a narrow contract. The search runs for real: a seeded bug through the run
pipeline into a SQLite file (runs of kind ``explore``, never ``latest``), the matrix it writes
reproduces the failure under ``convmatrix run``; the correct kernel exits 0.
"""

from __future__ import annotations

import math
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import torch
from runner_helpers import child_env
from sqlalchemy import select

from convmatrix.cli import build_parser
from convmatrix.core.contract import (
    FEATURES,
    STATE_LEN_K,
    Capabilities,
    Geometry,
    refusal,
)
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.models import Run
from convmatrix.db.queries import resolve_run
from convmatrix.kernels.interface.registry import load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.matrix.build import case_elements
from convmatrix.pipeline.explore import ExploreOptions, explore_kernel, round_limits
from convmatrix.pipeline.run import run
from convmatrix.runners.options import RunOptions
from convmatrix.search.explore import ExploreSettings
from convmatrix.search.space import _log_uniform, case_entry, draw_cases, expand_entries

TILED = load("tiled")  # T=64, C_t=32, vec=8


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Narrow:
    """A kernel's declared contract, narrow on every axis a real adapter narrows (fla, vLLM):
    one width, two dtype pairs, one layout, no packing or ring buffer, S == K, one token per
    update call, the final state per sequence. Drawing needs the declaration only."""

    name = "narrow"

    def __init__(self) -> None:
        self.capabilities = Capabilities(
            widths=frozenset({4}),
            dtype_pairs=frozenset({("bfloat16", "float32"), ("float32", "float32")}),
            layouts=frozenset({"channel_last"}),
            features=FEATURES - {"packed", "ring_buffer"},
            geometry=Geometry(time_tile=16, channel_tile=64, vector_width=4),
            state_lens=STATE_LEN_K,
            max_update_tokens=1,
            final_state="per_sequence",
        )

    def contract_violation(self, case):
        return self.capabilities.contract_violation(case)


def test_the_same_seed_draws_the_same_cases():
    first = draw_cases(TILED, 11, 40, 10**6)
    again = draw_cases(TILED, 11, 40, 10**6)
    other = draw_cases(TILED, 12, 40, 10**6)
    assert [(d.case.id, d.entry) for d in first] == [(d.case.id, d.entry) for d in again]
    assert [d.case.id for d in first] != [d.case.id for d in other]


@pytest.mark.parametrize("kernel", [TILED, Narrow()], ids=["tiled", "narrow"])
def test_every_drawn_case_is_valid_supported_and_within_the_budget(kernel):
    limit = 50_000
    drawn = draw_cases(kernel, 3, 120, limit)
    for d in drawn:
        case = d.case
        assert case_elements(case) <= limit, case.pytest_id
        assert case.expect == "ok" and refusal(kernel, case) is None, case.pytest_id
        # The case is what the matrix language builds from its entry, back and forth.
        (again,) = expand_entries([case_entry(case)], kernel)
        assert again.id == case.id and again.checks == case.checks
    ops = Counter(d.op for d in drawn)
    assert set(ops) == {"fwd", "fwd_bwd", "update"}
    if isinstance(kernel, Narrow):
        assert {d.case.width for d in drawn} == {4}
        assert {d.case.layout for d in drawn} == {"channel_last"}
        assert all(d.case.seq_lens is None for d in drawn)
        updates = [d.case for d in drawn if d.op == "update"]
        assert all(c.tokens == 1 and c.state_len == c.width for c in updates)
    else:  # the whole space: every dimension takes more than one value
        cases = [d.case for d in drawn]
        varied = ("width", "x_dtype", "w_dtype", "layout", "gap", "activation", "bias",
                  "initial_state", "final_state", "slots", "circular", "grad_layout")  # fmt: skip
        for field in varied:
            assert len({getattr(c, field) for c in cases}) > 1, field
        assert any(c.seq_lens and min(c.seq_lens) < 0 for c in cases)  # padding
        assert any(c.checks for c in cases)


def _near_boundary(value: int, steps: tuple[int, ...]) -> bool:
    """Within one of a power of two (>= 8) or of a multiple of one of ``steps``."""
    for v in (value - 1, value, value + 1):
        if v >= 8 and v & (v - 1) == 0:
            return True
        if any(v >= s and v % s == 0 for s in steps):
            return True
    return False


def test_draws_lean_on_tile_and_power_of_two_boundaries_and_reach_the_size_limits():
    big = 5 * 10**7
    drawn = [d.case for d in draw_cases(TILED, 5, 300, big)]
    lengths = [c.seqlen for c in drawn if c.seqlen and c.seqlen > 16]
    dims = [c.dim for c in drawn if c.dim > 16]
    rng = random.Random(5)  # the control: unbiased log-uniform values over the same ranges
    control_l = [_log_uniform(rng, 17, max(lengths)) for _ in range(2000)]
    control_c = [_log_uniform(rng, 17, max(dims)) for _ in range(2000)]

    def share(values, steps):
        return sum(_near_boundary(v, steps) for v in values) / len(values)

    assert share(lengths, (64,)) > 3 * share(control_l, (64,))
    assert share(dims, (32,)) > 3 * share(control_c, (32,))  # vec=8: +-1 covers 3/8 of all
    # The size bugs' regions are reached at this budget (issue 25: past 2^24 elements,
    # 1024 channels, 4096 tokens), the boundaries themselves among them.
    assert any(case_elements(c) > 2**24 for c in drawn)
    assert any(c.dim > 1024 for c in drawn) and any((c.seqlen or 0) > 4096 for c in drawn)
    assert any(c.dim in (1023, 1024, 1025) or c.seqlen in (4095, 4096, 4097) for c in drawn)


def test_draws_reach_the_edges_of_a_narrow_contract():
    drawn = [d.case for d in draw_cases(Narrow(), 8, 120, 20_000)]
    finals = [c for c in drawn if c.final_state and c.op != "update"]
    assert finals
    # short chunks: L < K-1 with the final state coming partly from the initial state
    assert any(c.seqlen < c.width - 1 for c in drawn if c.op != "update")
    widths = {c.width for c in drawn}
    assert widths == {4}
    # length edges of K itself: 1, K-2, K-1, K, K+1 all drawn
    lengths = {c.seqlen for c in drawn if c.op != "update"}
    assert {1, 2, 3, 4, 5} <= lengths


def _runs(url: str) -> list[Run]:
    with Database(url) as database, database.session() as session:  # ORM rows: a session
        return list(session.scalars(select(Run).order_by(Run.id)))


def test_explore_finds_a_seeded_bug_records_it_and_writes_a_matrix_that_reproduces_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'explore.db'}"
    out = tmp_path / "found.yaml"
    settings = ExploreSettings(
        budget_s=60, seed=2, max_failures=1, round_s=1, shrink_runs=10, shrink_limit=2
    )
    options = ExploreOptions(
        kernel="seeded:taps_reversed", settings=settings, max_elements=2048, workers=0, db=url,
        out=out, device="cpu",
    )  # fmt: skip
    lines = []
    report = explore_kernel(options, on_progress=lambda p: lines.append(p.line()))
    assert report.exit_code == 1 and report.findings
    assert lines and "cases/min" in lines[0]
    finding = report.findings[0]
    assert finding.shrunk is not None and finding.shrunk.runs <= 10
    drawn = finding.failures[0].case
    assert case_elements(finding.case) <= case_elements(drawn)
    # Every round is a recorded run of kind explore, holding its drawn cases; none is latest.
    runs = _runs(url)
    assert [r.kind for r in runs] == ["explore"] * report.rounds
    assert [r.id for r in runs] == report.run_ids
    # The written matrix holds the finding: `run` fails it on the bug, passes it on tiled.
    spec = load_matrix(str(out))
    assert [c.id for c in expand_matrix(spec, TILED).cases] == [f.case.id for f in report.findings]
    for kernel, passed in (("seeded:taps_reversed", False), ("tiled", True)):
        end = run(RunOptions(matrix=str(out), kernel=kernel, device="cpu", workers=0, db=url))
        assert end.account.passed is passed, kernel
    with Database(url) as database, database.reading() as session:
        assert resolve_run(session, "latest").kernel == "tiled"  # the plain run, not explore's


def test_explore_of_a_correct_kernel_exits_0_when_the_budget_runs_out(tmp_path):
    db = tmp_path / "ok.db"
    out = tmp_path / "none.yaml"
    argv = [sys.executable, "-m", "convmatrix", "explore", "--kernel", "tiled", "--budget", "4s",
            "--max-elements", "3e3", "--seed", "4", "-n", "0", "--device", "cpu",
            "--db", f"sqlite:///{db}", "--out", str(out), "--round", "2s"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    wall_s = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round ")]
    assert rounds and all(", 0 failed" in line for line in rounds)
    assert not out.exists()
    runs = _runs(f"sqlite:///{db}")
    recorded = [line for line in rounds if "(run " in line]  # (the budget may end a round
    assert len(runs) == len(recorded) >= len(rounds) - 1  # before its run is recorded)
    assert {r.kind for r in runs} == {"explore"}
    # The budget holds: its own clock passes 4 s by one round at most (2 s planned, a few
    # seconds on a loaded machine); ten times the budget would be 40 s of rounds.
    assert _elapsed(done.stdout) < 4 + 10, done.stdout
    assert wall_s < 10 * 4, wall_s


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--budget", "soon"], "--budget"),
        (["--budget", "0"], "--budget"),
        (["--max-elements", "0"], "--max-elements"),
        (["--max-elements", "1e10"], "--max-elements"),
        (["--max-elements", "2.5"], "--max-elements"),
        (["--max-failures", "0"], "--max-failures"),
    ],
)
def test_bad_arguments_are_usage_errors_naming_the_argument(args, named):
    parsed = build_parser("explore").parse_args(["explore", "--kernel", "tiled", *args])
    with pytest.raises(UsageError, match=named):
        parsed.handler(parsed)


def test_an_out_that_cannot_be_written_is_a_usage_error_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, why in (
        (blocker / "sub" / "found.yaml", f"{blocker} is a file"),
        (tmp_path, "is a directory"),
    ):
        argv = [
            "explore",
            "--kernel",
            "tiled",
            "--out",
            str(out),
            "--db",
            f"sqlite:///{tmp_path / 'no.db'}",
        ]
        parsed = build_parser("explore").parse_args(argv)
        with pytest.raises(UsageError, match=f"--out {re.escape(str(out))}: .*{re.escape(why)}"):
            parsed.handler(parsed)
    assert not (tmp_path / "no.db").exists()


def test_a_bad_argument_exits_2_before_anything_runs(tmp_path):
    argv = [sys.executable, "-m", "convmatrix", "explore", "--kernel", "tiled", "--budget",
            "soon", "--db", f"sqlite:///{tmp_path / 'no.db'}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--budget" in done.stderr, done.stderr
    assert not (tmp_path / "no.db").exists()


def test_parsers_of_budget_and_counts():
    from convmatrix.commands.explore import parse_budget, parse_count

    assert parse_budget("90") == 90 and parse_budget("10m") == 600 and parse_budget("1.5h") == 5400
    assert parse_count("5e7", "--max-elements") == 50_000_000
    with pytest.raises(UsageError, match="--budget"):
        parse_budget("-3m")
    assert math.isclose(parse_budget("0.5s"), 0.5)


# -- the budget, signals and faults stop a search: its findings kept (issue 33) --------------

BUDGET_S = 8.0


def _elapsed(stdout: str) -> float:
    """The search's own clock, from its summary line (process start-up not included)."""
    match = re.search(r"^explore .* cases in \d+ rounds, (\d+)s, ", stdout, flags=re.M)
    assert match, stdout
    return float(match.group(1))


def _explore_argv(kernel: str, tmp_path, workers: str, *extra: str, db: str = "") -> list[str]:
    db = db or f"sqlite:///{tmp_path / 'e.db'}"
    return [sys.executable, "-m", "convmatrix", "explore", "--kernel", kernel, "-n", workers,
            "--device", "cpu", "--max-elements", "2e3", "--db", db,
            "--out", str(tmp_path / "found.yaml"), *extra]  # fmt: skip


@pytest.mark.parametrize("workers", ["0", "1"])
def test_explore_of_a_hanging_kernel_ends_with_its_budget(tmp_path, workers):
    """Every call of ``search_kernels:Hangs`` sleeps an hour. Each case of a round may take
    the budget left at most and the round is cut a grace after the budget (workers: their
    start-up; in one process at the budget itself), so the search ends with its budget, not
    after the matrix's 120 s per case, nor after ten budgets. With a worker the hung case is
    a ``timeout`` failure, written as a finding; in one process it is cut without a verdict,
    and a search that judged no case ends 4 (nothing judged), never 0 ("found nothing")."""
    argv = _explore_argv("search_kernels:Hangs", tmp_path, workers, "--budget", f"{BUDGET_S:g}s")
    started = time.monotonic()
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=600)
    wall_s = time.monotonic() - started
    assert done.returncode in (1, 4), done.stdout + done.stderr
    _, cut_s = round_limits(2000, BUDGET_S, BUDGET_S, in_process=workers == "0")
    assert _elapsed(done.stdout) <= cut_s + 10, done.stdout  # the cut, then the round's end
    assert wall_s < 10 * BUDGET_S, wall_s  # start-up included; a tenfold budget: >= 80 s
    assert "the budget ran out inside the last round" in done.stdout, done.stdout
    if done.returncode == 1:  # the hung case recorded before the cut (a worker's limit)
        assert "  timeout  " in done.stdout and (tmp_path / "found.yaml").exists()


def _lines(stream) -> queue.Queue:
    """The lines of ``stream`` as they come, read by a thread (a pipe never blocks the test)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _until_a_failing_round(lines: queue.Queue, limit_s: float = 300) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith("round ") and ", 0 failed" not in line:
            return seen
    raise AssertionError("no round found a failure:\n" + "".join(seen))


@pytest.mark.parametrize("workers", ["0", "1"])
def test_sigterm_stops_explore_within_seconds_with_the_findings_so_far(tmp_path, workers):
    """``search_kernels:SlowReversedTaps`` fails every case, 0.3 s a call, under a budget of
    ten minutes. SIGTERM a few seconds into the second round (a case running in this process,
    or in the xdist worker): exit 130 within 10 s, the first round's failures written as a
    matrix that expands to cases, every round's run closed (none left running)."""
    argv = _explore_argv("search_kernels:SlowReversedTaps", tmp_path, workers, "--budget",
                         "10m", "--round", "3s")  # fmt: skip
    explore_run = subprocess.Popen(argv, env=child_env(SLOW_S="0.3"), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lines = _lines(explore_run.stdout)
        _until_a_failing_round(lines)
        time.sleep(3)  # into the next round
        sent = time.monotonic()
        explore_run.send_signal(signal.SIGTERM)
        explore_run.wait(timeout=120)
        stopped_s = time.monotonic() - sent
        stderr = explore_run.stderr.read()
    finally:
        explore_run.kill()
    assert explore_run.returncode == 130, stderr
    assert stopped_s < 10, stopped_s
    assert stderr.splitlines()[-1].startswith("convmatrix explore: interrupted (SIGTERM)"), stderr
    found = tmp_path / "found.yaml"
    assert "(interrupted: the findings so far)" in found.read_text()
    assert expand_matrix(load_matrix(str(found)), TILED).cases
    runs = _runs(f"sqlite:///{tmp_path / 'e.db'}")
    assert runs and {r.status for r in runs} <= {"finished", "interrupted"}


@pytest.mark.requires("postgresql-server")
def test_a_database_gone_mid_search_ends_in_one_line_and_exit_3_with_the_findings_so_far(
    tmp_path,
):
    """The search's PostgreSQL server stops (``pg_ctl stop -m immediate``) once a round has
    found failures: the next round cannot record, which is the machine's fault, not the
    kernel's nor the command line's: one line naming the database, exit 3, and the failures
    found so far written."""
    from private_postgres import PrivatePostgres

    with PrivatePostgres() as pg:
        argv = _explore_argv("search_kernels:SlowReversedTaps", tmp_path, "0", "--budget",
                             "10m", "--round", "2s", db=pg.url)  # fmt: skip
        env = child_env(SLOW_S="0.1", CONVMATRIX_DB_RETRY_S="2")
        explore_run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _until_a_failing_round(_lines(explore_run.stdout))
            pg.stop("immediate")
            explore_run.wait(timeout=300)
            stderr = explore_run.stderr.read()
        finally:
            explore_run.kill()
    assert explore_run.returncode == 3, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("convmatrix explore:")]
    assert len(errors) == 1 and errors[0] == stderr.splitlines()[-1], stderr
    assert "error: round " in errors[0] and "database" in errors[0], stderr
    found = tmp_path / "found.yaml"
    assert "stopped by an infrastructure failure" in found.read_text()
    assert expand_matrix(load_matrix(str(found)), TILED).cases


def test_what_counts_as_the_machines_fault():
    """The faults that end a search as infrastructure (exit 3), also behind a lower layer's
    own error; anything else is a bug to show, not to call infrastructure. (The thread fault
    is not provoked for real: as root no process limit holds.)"""
    import errno

    from sqlalchemy.exc import OperationalError

    from convmatrix.pipeline.explore import _fault

    assert "can't start new thread" in _fault(RuntimeError("can't start new thread"))
    assert _fault(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"))
    try:
        try:
            raise OperationalError("connect", {}, Exception("Connection refused"))
        except OperationalError as err:
            raise UsageError("cannot use database x: connection failed") from err
    except UsageError as exc:
        assert _fault(exc) == "cannot use database x: connection failed"
    assert _fault(RuntimeError("a kernel's own error")) is None
    assert _fault(UsageError("--budget 'soon'")) is None
