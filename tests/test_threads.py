"""The thread policy of CPU runs (``runners.run.threads``): its decisions, and real runs (``-n 0``
and ``-n 2`` xdist workers) whose recorded provenance states it and whose processes have it."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from runner_helpers import LIMIT_S, TINY, child_env, convmatrix_cmd, runs

from convmatrix.core.environment import MAX_THREADS, THREADS_PER_CORE, thread_limit
from convmatrix.core.errors import UsageError
from convmatrix.core.recorded import Recorded
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.placement import place_worker
from convmatrix.runners.run.threads import ThreadSetting, decide, export

OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CONVMATRIX_THREADS")


def test_by_default_each_process_gets_one_thread_that_sleeps_when_idle():
    policy = decide(None, {})
    assert (policy.spec, policy.source, policy.wait) == ("auto", "default", "PASSIVE")
    assert [policy.threads(w, 16) for w in (0, 1, 2, 16)] == [1, 1, 1, 1]
    assert policy.environment() == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_torch_is_the_policy_of_before_a_share_of_the_cores_spinning():
    policy = decide("torch", {})
    assert policy.wait is None and policy.environment() == {}
    assert policy.threads(0, 8) is None  # -n 0: torch's own default
    assert [policy.threads(w, 16) for w in (1, 3, 32)] == [16, 5, 1]


def test_an_explicit_omp_num_threads_wins_with_the_users_wait():
    env = {"OMP_NUM_THREADS": "3", "CONVMATRIX_THREADS": "2"}
    policy = decide("auto", env)
    assert (policy.spec, policy.source, policy.wait) == ("3", "OMP_NUM_THREADS", None)
    assert policy.threads(2, 16) == 3
    nested = decide(None, {"OMP_NUM_THREADS": "4,2", "OMP_WAIT_POLICY": "active"})
    assert (nested.threads(0, 2), nested.wait) == (4, "active")
    # not a count OpenMP would take: the policy decides as if unset
    assert decide(None, {"OMP_NUM_THREADS": "lots"}).source == "default"


def test_threads_option_beats_the_variable_and_a_bad_one_is_refused_naming_it():
    env = {"CONVMATRIX_THREADS": "torch"}
    assert decide(None, env).source == "CONVMATRIX_THREADS" and decide(None, env).wait is None
    assert (decide("2", env).spec, decide("2", env).source) == ("2", "--threads")
    assert decide("2", {"OMP_WAIT_POLICY": "ACTIVE"}).wait == "ACTIVE"  # the user's wait kept
    for bad in ("0", "many", "-1", str(thread_limit() + 1)):
        with pytest.raises(UsageError, match=f"--threads '{bad}'"):
            decide(bad, {})
    with pytest.raises(UsageError, match="--threads"):
        RunOptions(matrix="smoke", kernel="torch", threads="zero").checked()


def test_workers_get_the_policy_and_its_wait_accelerators_keep_their_own():
    auto = place_worker("gw5", 3, "cpu", 1, cores=16, environ={})
    assert (auto.threads, auto.env) == (1, {"OMP_WAIT_POLICY": "PASSIVE"})
    old = place_worker("gw5", 3, "cpu", 1, 16, {}, ThreadSetting("torch", "--threads", None))
    assert (old.threads, old.env) == (5, {})
    cuda = place_worker("gw1", 2, "cuda", 2, 16, {}, ThreadSetting())
    assert cuda.threads is None and cuda.env == {"CUDA_VISIBLE_DEVICES": "1"}


def test_export_keeps_a_wait_the_user_set():
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    export(decide(None, env), env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}


RUNS = {
    # -n 0: this host's torch default is its core count; the policy gives one
    "n0-default": ("0", [], {}, ("auto", "default", "PASSIVE", 1)),
    # xdist workers at a count that is no share of the cores: only the policy gives it
    "n2-threads3": ("2", ["--threads", "3"], {}, ("3", "--threads", "PASSIVE", 3)),
    # the user's OMP_NUM_THREADS beats --threads, and no wait is imposed on them
    "n0-omp": ("0", ["--threads", "2"], {"OMP_NUM_THREADS": "3"}, ("3", OMP[0], None, 3)),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_records_its_policy_and_its_processes_have_it(tmp_path, sqlite_url, name):
    workers, extra, env_extra, (spec, source, wait, threads) = RUNS[name]
    spy = tmp_path / "threads.txt"
    env = {k: v for k, v in child_env(THREAD_SPY_FILE=str(spy)).items() if k not in OMP}
    env.update(env_extra)
    cmd = convmatrix_cmd(
        "run", "--matrix", str(TINY), "--kernel", "thread_kernels:ThreadSpy",
        "-n", workers, "--db", sqlite_url, *extra,
    )  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = Recorded.of(runs(sqlite_url)[-1].options).threads
    assert (recorded["spec"], recorded["source"], recorded["wait"]) == (spec, source, wait)
    assert recorded["threads"] == threads and recorded["workers"] == int(workers)
    seen = Counter(tuple(line.split()) for line in spy.read_text().splitlines())
    assert {(t, w) for _, t, w in seen} == {(str(threads), wait or "-")}, seen


def test_an_in_process_run_gives_its_cases_the_policy_and_the_caller_its_threads_back(
    tmp_path, monkeypatch
):
    import torch
    from runner_helpers import KERNELS

    import convmatrix

    spy = tmp_path / "threads.txt"
    monkeypatch.syspath_prepend(str(KERNELS))
    monkeypatch.setenv("THREAD_SPY_FILE", str(spy))
    for name in OMP:  # set first, so that what the run exports is undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 3  # a count the caller does not have
    account = convmatrix.run(
        str(TINY), "thread_kernels:ThreadSpy", workers=0, no_db=True, threads=str(wanted)
    )
    assert account.counts.get("passed") == account.planned, account
    assert {line.split()[1] for line in spy.read_text().splitlines()} == {str(wanted)}
    assert torch.get_num_threads() == before


def test_the_thread_cap_is_per_core_and_bounded():
    assert thread_limit(2) == 2 * THREADS_PER_CORE == 128
    assert thread_limit(1000) == MAX_THREADS


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "CONVMATRIX_THREADS"])
def test_a_thread_count_past_the_cap_is_refused_before_torch_starts(
    tmp_path, sqlite_url, workers, variable
):
    """OMP_NUM_THREADS=100000: with -n 0 torch segfaulted at the first case (blamed on the
    case), with -n 2 the workers died and the run stayed 'running' with 0 of 4 results. Now:
    exit 2, one line naming the variable, before torch loads, nothing recorded."""
    env = {k: v for k, v in child_env().items() if k not in OMP}
    env[variable] = "100000"
    cmd = convmatrix_cmd("run", "--matrix", str(TINY), "--kernel", "torch", "-n", workers,
                         "--db", sqlite_url)  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"convmatrix run: error: environment variable {variable}='100000'")
    assert "cap" in line or "1 to" in line
    assert not (tmp_path / "results.db").exists()  # refused before the database was opened
