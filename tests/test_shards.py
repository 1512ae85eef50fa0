"""``--shard I/N --run-label L``: shards as concurrent real processes writing one run into the
real PostgreSQL server (and SQLite); completeness and the missing-shard report."""

from __future__ import annotations

import subprocess
import threading
import xml.etree.ElementTree as ET

import pytest
from db_fixtures import fake_meta
from runner_helpers import LIMIT_S, TINY, child_env, convmatrix_cmd, results, runs
from sqlalchemy import select, update

from convmatrix.core.errors import UsageError
from convmatrix.db import ResultWriter, open_database, tables
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.runners.run.shards import parse_shard
from convmatrix.runners.run.store import Shard
from convmatrix.runners.run.workload import load_workload


def smoke_ids() -> set[str]:
    return {c.id for c in load_workload("smoke", TorchKernel()).cases}


def shard_args(url: str, shard: str, label: str) -> list[str]:
    """One shard of the smoke matrix, in process (one worker, as one per host would)."""
    run = ["--matrix", "smoke", "--kernel", "torch", "-n", "0", "--db", url]
    return [*run, "--shard", shard, "--run-label", label]


def start_shards(tmp_path, url: str, label: str, indices, count: int) -> list[subprocess.Popen]:
    """Shards as concurrent processes."""
    procs = []
    for index in indices:
        cmd = convmatrix_cmd("run", *shard_args(url, f"{index}/{count}", label))
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=child_env(),
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = [p.communicate(timeout=LIMIT_S)[0] for p in procs]
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out
    return outs


def cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        convmatrix_cmd(*args),
        cwd=tmp_path,
        env=child_env(),
        text=True,
        capture_output=True,
        timeout=LIMIT_S,
    )


def test_shards_partition_the_cases_disjoint_and_complete():
    ids = smoke_ids()
    for count in (1, 2, 3, 4, 7):
        parts = [{i for i in ids if Shard(k, count, "x").owns(i)} for k in range(count)]
        assert set().union(*parts) == ids
        assert sum(len(p) for p in parts) == len(ids)
    assert all(parts), "7 shards of 35 cases: a hash partition leaves none empty here"


@pytest.mark.postgres
def test_four_shards_into_postgres_make_one_complete_run(tmp_path, postgres_url):
    outs = finish(start_shards(tmp_path, postgres_url, "nightly-42", range(4), 4))
    assert all("shard " in out and "/4 [finished] of run" in out for out in outs)
    (info,) = runs(postgres_url)
    assert info.status == "finished" and info.shard_count == 4
    stored = results(postgres_url, info.id)
    assert {r.case.id for r in stored} == smoke_ids()  # the unsharded run's cases, once each
    # The run's counters were incremented by four concurrent writers: none overwrote another.
    assert info.counts["passed"] == len(stored) == info.n_planned == 35
    report = cli(tmp_path, "report", "nightly-42", "--db", postgres_url, "--out", str(tmp_path))
    assert report.returncode == 0, report.stdout + report.stderr
    assert "PASSED" in report.stdout and "missing" not in report.stdout


@pytest.mark.postgres
def test_three_of_four_shards_make_an_incomplete_run_naming_the_missing_one(tmp_path, postgres_url):
    url = postgres_url
    finish(start_shards(tmp_path, url, "ci-7", (0, 1, 3), 4))
    (info,) = runs(url)
    assert info.status == "running"  # shard 2 has not reported
    missing = smoke_ids() - {r.case.id for r in results(url, info.id)}
    assert missing and all(Shard(2, 4, "ci-7").owns(i) for i in missing)
    report = cli(tmp_path, "report", "ci-7", "--db", url, "--out", str(tmp_path))
    assert report.returncode == 1
    assert "INCOMPLETE" in report.stdout
    assert "shard(s) missing: 2/4 never started" in report.stdout
    html = (tmp_path / f"run-{info.id}.html").read_text()
    assert "missing: 2/4 never started" in html
    diff = cli(tmp_path, "diff", "ci-7", "ci-7", "--db", url, "--out", str(tmp_path / "d.html"))
    assert "HEAD incomplete: shard(s) missing: 2/4 never started" in diff.stdout, diff.stdout
    # The late shard completes the run.
    finish(start_shards(tmp_path, url, "ci-7", (2,), 4))
    (info,) = runs(url)
    assert info.status == "finished" and info.counts["passed"] == 35


def test_a_shard_of_another_count_or_matrix_is_refused(tmp_path, sqlite_url):
    finish(start_shards(tmp_path, sqlite_url, "n1", (0,), 2))
    bad = cli(tmp_path, "run", *shard_args(sqlite_url, "1/3", "n1"))
    assert bad.returncode == 2
    assert "was started with 2 shards" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    ("spec", "env", "expected"),
    [
        ("1/4", {}, Shard(1, 4, "L")),
        ("auto/8", {"JOB_COMPLETION_INDEX": "5"}, Shard(5, 8, "L")),
        (
            "auto",
            {
                "SLURM_ARRAY_TASK_ID": "12",
                "SLURM_ARRAY_TASK_MIN": "10",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            Shard(2, 3, "L"),
        ),
        (
            "auto",
            {"BUILDKITE_PARALLEL_JOB": "0", "BUILDKITE_PARALLEL_JOB_COUNT": "2"},
            Shard(0, 2, "L"),
        ),
    ],
)
def test_the_shard_index_comes_from_the_ci(spec, env, expected):
    assert parse_shard(spec, "L", env) == expected


def test_the_label_comes_from_the_ci_build_when_not_given():
    env = {
        "BUILDKITE_PARALLEL_JOB": "1",
        "BUILDKITE_PARALLEL_JOB_COUNT": "2",
        "BUILDKITE_BUILD_ID": "0190-ab",
    }
    assert parse_shard("auto", None, env) == Shard(1, 2, "buildkite_build_id-0190-ab")


@pytest.mark.parametrize(
    ("spec", "label", "env", "message"),
    [
        ("4/4", "L", {}, "the index must be in 0..N-1"),
        ("2", "L", {}, "give I/N"),
        ("a/4", "L", {}, "the index 'a' is not a whole number"),
        ("auto", "L", {}, "none of JOB_COMPLETION_INDEX"),
        ("auto", "L", {"JOB_COMPLETION_INDEX": "1"}, "give the count: auto/N"),
        ("0/2", None, {}, "--shard needs --run-label"),
        (None, "L", {}, "give --shard I/N too"),
    ],
)
def test_bad_shard_arguments_say_what_is_wrong(spec, label, env, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_shard(spec, label, env)


@pytest.mark.postgres
def test_the_last_of_two_shards_closing_at_once_finishes_the_run(postgres_url):
    """Shard 0's close is in flight (its shard row updated, not yet committed) when shard 1
    closes: shard 1 must wait for it and then see both finished. Without the run's row
    locked first, each read the other's shard as running (read committed) and the run of
    two finished shards stayed ``running`` for good."""
    engine = open_database(postgres_url)
    writers = [ResultWriter(engine, url=postgres_url) for _ in range(2)]
    run_id = writers[0].join_sharded_run(fake_meta(), "race", 2, 0)
    assert writers[1].join_sharded_run(fake_meta(), "race", 2, 1) == run_id
    closed: list[str] = []
    with engine.connect() as first:  # shard 0 closing, as its writer does, held open
        first.execute(select(tables.runs.c.id).where(tables.runs.c.id == run_id).with_for_update())
        mine = (tables.run_shards.c.run_id == run_id, tables.run_shards.c.shard == 0)
        first.execute(update(tables.run_shards).where(*mine).values(status="finished"))
        closer = threading.Thread(
            target=lambda: closed.append(writers[1].finish_shard(1, "finished"))
        )
        closer.start()
        closer.join(timeout=2)
        assert closer.is_alive(), "shard 1 closed without waiting for shard 0's close"
        first.commit()
    closer.join(timeout=LIMIT_S)
    assert closed == ["finished"]
    with engine.connect() as conn:
        assert (
            conn.scalar(select(tables.runs.c.status).where(tables.runs.c.id == run_id))
            == "finished"
        )
    assert writers[0].finish_shard(0, "finished") == "finished"  # its heartbeat stops
    engine.dispose()


def _junit_cases(path) -> tuple[set[str], list[str]]:
    """(case ids, names of the run-level error testcases) of a JUnit file."""
    suite = ET.parse(path).getroot().find("testsuite")
    ids = {t.get("id") for t in suite.iter("testcase") if t.get("id")}
    problems = [
        t.get("name") for t in suite.iter("testcase") if t.get("classname") == "convmatrix.run"
    ]
    assert int(suite.get("tests")) == len(ids) + len(problems)
    return ids, problems


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_each_shard_reports_its_own_cases_and_ci_report_the_whole_run(tmp_path, request, db):
    """Two shards of one run, one after the other into one database: each shard's JUnit and
    summary hold that shard's cases only (not whatever the database held when it ended), the
    first never claims the run finished nor scans half of it, and ``ci-report`` writes the
    whole run's JUnit once both reported, naming the missing shard before."""
    url = request.getfixturevalue(f"{db}_url")
    ids, outs = smoke_ids(), []
    for index in (0, 1):
        out = tmp_path / f"shard{index}"
        args = [*shard_args(url, f"{index}/2", "ci-9"), "--junit", str(out / "junit.xml"),
                "--summary", str(out / "summary.md")]  # fmt: skip
        done = cli(tmp_path, "run", *args)
        assert done.returncode == 0, done.stdout + done.stderr
        owned = {i for i in ids if Shard(index, 2, "ci-9").owns(i)}
        assert _junit_cases(out / "junit.xml") == (owned, [])
        summary = (out / "summary.md").read_text()
        assert f"shard {index}/2 PASSED" in summary and f"| {len(owned)} | 0 |" in summary
        assert f"Shard {index}/2: this shard's cases only" in summary
        outs.append(done.stdout)
        if index == 0:  # the whole run is not there yet: say so, check missing shards
            early = cli(tmp_path, "ci-report", "ci-9", "--db", url,
                        "--junit", str(tmp_path / "early.xml"))  # fmt: skip
            assert early.returncode == 1, early.stdout + early.stderr
            assert _junit_cases(tmp_path / "early.xml") == (owned, ["shards-missing"])
            assert "shard(s) missing: 1/2 never started" in early.stdout
    first, last = outs
    assert "shard 0/2 [finished] of run 1:" in first and "run 1 [running] so far:" in first
    assert "run 1 [finished]" not in first
    assert "regressions: not scanned (shard 0/2: the run is not whole yet" in first
    assert "  run 1 [finished]: 35 passed" in last and "regressions: 0 new" in last
    merged = cli(tmp_path, "ci-report", "ci-9", "--db", url, "--junit", str(tmp_path / "all.xml"),
                 "--summary", str(tmp_path / "all.md"))  # fmt: skip
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert _junit_cases(tmp_path / "all.xml") == (ids, [])
    assert "(run 1) PASSED" in (tmp_path / "all.md").read_text()


def test_the_whole_runs_summary_names_the_regressions_its_last_shard_raised(tmp_path, sqlite_url):
    """A good run, then the same kernel broken in two shards: the first shard cannot know
    what is new (the run is half there) and says so; the last one scans the whole run and
    names its own cases' regressions; the merged summary of ``ci-report`` names every one,
    and ``--fail-on new-regressions`` fails the report job."""
    switch = tmp_path / "switch"
    switch.write_text("good")
    base = ["--matrix", str(TINY), "--kernel", "service_kernels:Switched", "-n", "0",
            "--db", sqlite_url]  # fmt: skip

    def switched(*args: str) -> subprocess.CompletedProcess[str]:
        env = child_env(CONVMATRIX_TEST_SWITCH=str(switch))
        return subprocess.run(convmatrix_cmd(*args), cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=LIMIT_S)  # fmt: skip

    assert switched("run", *base).returncode == 0
    switch.write_text("bad")
    outs = []
    for index in (0, 1):
        shard = ["--shard", f"{index}/2", "--run-label", "bad-1", "--fail-on", "new-regressions",
                 "--summary", str(tmp_path / f"s{index}.md")]  # fmt: skip
        outs.append(switched("run", *base, *shard))
    bad_run = runs(sqlite_url)[-1]
    failing = {r.case.id for r in results(sqlite_url, bad_run.id) if r.outcome == "failed"}
    mine = [{i for i in failing if Shard(k, 2, "bad-1").owns(i)} for k in (0, 1)]
    assert all(mine), "each shard of tiny holds a failing case"
    first, last = outs
    assert first.returncode == 0, first.stdout + first.stderr  # cannot tell what is new
    text = (tmp_path / "s0.md").read_text()
    assert "Not scanned" in text and f"### Failing cases ({len(mine[0])})" in text
    assert last.returncode == 1, last.stdout + last.stderr  # its own new regressions
    assert f"**{len(mine[1])} new regressions**" in (tmp_path / "s1.md").read_text()
    merged = switched("ci-report", "bad-1", "--db", sqlite_url, "--fail-on",
                      "new-regressions", "--summary", str(tmp_path / "all.md"))  # fmt: skip
    assert merged.returncode == 1, merged.stdout + merged.stderr
    text = (tmp_path / "all.md").read_text()
    assert f"(run {bad_run.id}) FAILED" in text and "Compared with run 1." in text
    assert f"**{len(failing)} new regressions** (alert 1)" in text
