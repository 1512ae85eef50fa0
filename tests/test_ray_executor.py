"""The Ray executor on a real two-node Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``,
as Ray's own failure tests use): each node declares one ``cpu_slot``; Ray's temporary files
go to a temporary folder. Every run is a real ``convmatrix run --executor ray --address ...``
process writing a real SQLite database; one node is removed during a run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from components import require
from runner_helpers import TINY, TINY_L7, child_env, convmatrix_cmd, run, runs
from runner_helpers import results as stored_results

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

RUN_LIMIT_S = 120  # a run here takes 10-30 s; a driver that cannot reach the cluster hangs

# One cpu_slot per node (both on this host, at its own address).
NODE = {"num_cpus": 1, "resources": {"cpu_slot": 1}, "include_dashboard": False}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes, one cpu_slot each; actors' processes see the planted kernels."""
    require("ray")  # the ray extra: skipped without it locally, failed under CI
    from ray.cluster_utils import Cluster

    names = ("PYTHONPATH", "RAY_AUTH_MODE", "RAY_TMPDIR", "RAY_worker_niceness")
    saved = {k: os.environ.get(k) for k in names}
    temp = tempfile.mkdtemp(prefix="cmray")  # short: Ray's socket paths must fit 107 bytes
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # the nodes' workers inherit it
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_TMPDIR"] = temp
    # Ray's workers run at niceness 15 by default: beside the other xdist worker they got ~3%
    # of a core and runs took over 120 s (docs/deploy.md). Nodes of a shared host run at 0.
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 (Ray spells it so)
    os.makedirs(os.path.join(temp, "ray"))  # where Ray writes the address of the cluster
    made = Cluster(initialize_head=True, head_node_args={**NODE, "temp_dir": f"{temp}/ray"})
    made.add_node(**NODE)
    made.wait_for_nodes()
    try:
        yield made
    finally:
        made.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(temp, ignore_errors=True)


def ray_run(cluster: Cluster, where: Path, *args: str, **env: str):
    cmd = convmatrix_cmd("run", "--engine", "ray", "--address", cluster.address, *args)
    return subprocess.run(
        cmd,
        cwd=where,
        env=child_env(RAY_AUTH_MODE="disabled", **env),
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
    )


def _numbers(result) -> tuple:
    return (
        result.outcome,
        [(o.output, o.e_abs, o.e_rel, o.e_norm, o.passed) for o in result.outputs],
        sorted((p.name, p.passed) for p in result.properties),
    )


def test_smoke_on_two_nodes_matches_xdist_case_by_case(cluster, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    done = ray_run(cluster, tmp_path, "--matrix", "smoke", "--kernel", "torch", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "35 passed" in done.stdout
    assert "run niced" not in done.stderr  # the nodes were started at niceness 0
    xdist = run(convmatrix_cmd("run", "--matrix", "smoke", "--kernel", "torch", "--db", url,
                               "-n", "2"), tmp_path)  # fmt: skip
    assert xdist.returncode == 0, xdist.stdout
    ray_info, xdist_info = runs(url)
    assert ray_info.options["executor"] == "ray" and xdist_info.options["executor"] == "xdist"
    by_ray = {r.case.id: r for r in stored_results(url, ray_info.id)}
    by_xdist = {r.case.id: r for r in stored_results(url, xdist_info.id)}
    assert set(by_ray) == set(by_xdist) and len(by_ray) == 35
    # Exactly equal: the same inputs (drawn from the case id), the same code, one torch
    # thread per worker on this host in both engines.
    for case_id, result in by_ray.items():
        assert _numbers(result) == _numbers(by_xdist[case_id]), case_id
    # Both nodes ran cases, and each result says where.
    workers = {r.worker for r in by_ray.values()}
    assert len(workers) == 2, workers
    assert all(r.host and r.device_index == 0 and r.retries == 0 for r in by_ray.values())


def test_a_kernel_crash_is_confirmed_once_then_recorded_crashed(cluster, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    done = ray_run(cluster, tmp_path, "--matrix", str(TINY), "--kernel",
                   "bad_kernels:AbortsOnOneCase", "--db", url)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (info,) = runs(url)
    assert info.status == "finished" and info.counts["passed"] == 3
    stored = {r.case.id: r for r in stored_results(url, info.id)}
    crashed = [r for r in stored.values() if r.outcome == "crashed"]
    assert [r.case.pytest_id for r in crashed] == [TINY_L7]
    (result,) = crashed
    assert "SIGABRT" in result.message
    # Once on another device, then never again: one retry, and the two attempts' devices differ.
    assert result.retries == 1 and "confirming on another device" in result.retry_reason
    first = result.retry_reason.split("crashed on ", 1)[1].split(";")[0]
    assert first != result.worker
    assert all(r.retries == 0 for r in stored.values() if r is not result)


def test_losing_a_node_mid_run_loses_no_case_and_records_the_retries(cluster, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    victim = next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)
    cmd = convmatrix_cmd("run", "--engine", "ray", "--address", cluster.address, "--matrix",
                         "smoke", "--kernel", "slow_kernels:SlowTorch", "--db", url)  # fmt: skip
    env = child_env(RAY_AUTH_MODE="disabled", CONVMATRIX_PROGRESS_S="0.01")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        # Both actors busy (each kernel call sleeps 0.15 s): after a few results, stop the
        # second node with its actor and the case in flight there.
        seen = 0
        assert proc.stderr is not None
        for line in proc.stderr:
            seen += line.startswith("progress:")
            if seen >= 4:
                break
        assert seen >= 4, "no progress lines from the run"
        cluster.remove_node(victim, allow_graceful=False)
        out, err = proc.communicate(timeout=RUN_LIMIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.add_node(**NODE)
    assert proc.returncode == 0, out + err
    (info,) = runs(url)
    assert info.status == "finished" and info.counts["passed"] == 35
    stored = stored_results(url, info.id)
    assert len({r.case.id for r in stored}) == 35
    retried = [r for r in stored if r.retries]
    assert retried, "the case in flight on the lost node was not resubmitted"
    for result in retried:
        assert result.retries == 1 and "lost (" in result.retry_reason
        assert result.outcome == "passed"
    assert f"{len(retried)} case(s) retried" in out
    survivors = {r.worker for r in retried}
    assert len(survivors) == 1  # all resubmitted to the node that is left


def test_without_ray_the_engine_says_how_to_get_it(tmp_path):
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), child_env()["PYTHONPATH"]])}
    base = ["--matrix", str(TINY), "--kernel", "torch", "--no-db", "-n", "0"]
    done = run(convmatrix_cmd("run", *base, "--engine", "ray"), tmp_path, **env)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "unavailable: ray is not installed (pip install 'convmatrix[ray]')"
    ), done.stderr
    assert "Traceback" not in done.stderr
    plain = run(convmatrix_cmd("run", *base, "--case", TINY_L7), tmp_path, **env)
    assert plain.returncode == 0, plain.stdout + plain.stderr


@pytest.mark.requires("ray")
def test_a_cluster_the_engine_starts_runs_its_actors_unniced(tmp_path):
    """Without --address the engine starts its own one-host cluster, whose workers are the
    job: they must not run at Ray's default niceness of 15 (docs/deploy.md)."""
    temp = tempfile.mkdtemp(prefix="cmray")  # Ray's socket paths must fit 107 bytes
    try:
        cmd = convmatrix_cmd("run", "--engine", "ray", "-n", "1", "--matrix", str(TINY),
                             "--kernel", "torch", "--no-db")  # fmt: skip
        done = run(cmd, tmp_path, RAY_AUTH_MODE="disabled", RAY_TMPDIR=temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
    assert "run niced" not in done.stderr, done.stderr


@pytest.mark.requires("ray")
def test_an_address_where_nothing_listens_is_infrastructure_within_30_s(tmp_path):
    """``ray.init`` waited 10 minutes and more on a closed port; the executor probes the
    address first: one line, exit 3 (infrastructure), well within 30 s of starting."""
    with socket.socket() as probe:  # a port nothing listens on once this socket is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = convmatrix_cmd("run", "--executor", "ray", "--address", f"127.0.0.1:{port}",
                         "--matrix", str(TINY), "--kernel", "torch", "--no-db")  # fmt: skip
    start = time.monotonic()
    done = run(cmd, tmp_path, RAY_AUTH_MODE="disabled")
    took = time.monotonic() - start
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"convmatrix run: error: --executor ray --address 127.0.0.1:{port}: ")
    assert "nothing answers there" in line and "Traceback" not in done.stderr
    assert took < 30, f"{took:.0f} s"


def test_a_node_dead_at_start_is_infrastructure_and_the_run_is_kept(cluster, tmp_path):
    """A node gone but still listed (Ray notices after missed heartbeats): an actor placed
    there dies before it answers. That was a raw ActorDiedError traceback, exit 1 and no run;
    now the run is recorded first, and ends interrupted in one line with exit 3."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    ghost = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    (raylet,) = ghost.all_processes["raylet"]
    # Frozen, not killed: its connections stay open and Ray takes missed heartbeats (tens of
    # seconds) to mark it dead, longer than the run takes to start and count its slot.
    os.kill(raylet.process.pid, signal.SIGSTOP)
    try:
        done = ray_run(cluster, tmp_path, "--matrix", str(TINY), "--kernel", "torch", "--db", url)
    finally:
        os.kill(raylet.process.pid, signal.SIGCONT)
        cluster.remove_node(ghost, allow_graceful=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("convmatrix run: error: the Ray cluster failed under the run (run 1:")
    assert "ActorDiedError" in last
    (info,) = runs(url)
    assert info.status == "interrupted"  # recorded before any actor was asked anything
