"""The whole regression loop as a user lives it, through the real CLI, on SQLite and PostgreSQL:
a kernel in its own throwaway git repository, nightly runs of its good commit, of a commit that
breaks lengths past one tile, of a fix, and of the break coming back.

What must hold (issue "Regressions you can act on"): one alert whose regressions are the
failing cases, one each, with every output's usage before and after and an explanation naming
seqlen; ``confirm`` from the good checkout marks nothing flaky (it refuses, naming both
commits) and ``--checkout`` reruns the recorded commit (and the baseline's, where the checkout
stands); the fix closes the regressions and the break coming back opens new ones in a new
alert, the first alert keeping its regressions, fixed; confirm runs are never baselines nor
``latest``; an export imported twice leaves the counts as after the first import."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from runner_helpers import child_env, convmatrix_cmd
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from convmatrix.db import load_results, open_database
from convmatrix.db.models import AlertRow, RegressionRow, Run

GOOD = """from convmatrix.kernels.builtin.tiled import TiledKernel


class Kernel(TiledKernel):
    def __init__(self):
        super().__init__()
        self.name = "loopk"
"""
BAD = """from convmatrix.kernels.doubles.seeded import CATALOGUE


class Kernel(CATALOGUE["halo_off_by_one"]):  # lengths past one tile read a wrong halo
    def __init__(self):
        super().__init__()
        self.name = "loopk"
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip


def _git(repo, *args) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={**os.environ, **GIT_ENV})  # fmt: skip
    return done.stdout.strip()


def _repository(tmp_path) -> tuple[object, list[str]]:
    """Commits: 0 good, 1 breaks lengths past a tile, 2 fixes it, 3 breaks it again."""
    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i, text in enumerate((GOOD, BAD, GOOD + "# fixed\n", BAD + "# again\n")):
        (repo / "loopk.py").write_text(text)
        _git(repo, "add", "loopk.py")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas


def _cli(repo, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(PYTHONPATH=f"{repo}{os.pathsep}{child_env()['PYTHONPATH']}")
    return subprocess.run(convmatrix_cmd(*args), cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _nightly(repo, sha: str, url: str) -> subprocess.CompletedProcess[str]:
    _git(repo, "checkout", "-q", sha)
    return _cli(repo, "run", "--matrix", "smoke", "--kernel", "loopk:Kernel", "-n", "0",
                "--db", url)  # fmt: skip


def _counts(url: str) -> tuple[int, int, int]:
    engine = open_database(url)
    with Session(engine) as session:
        counts = tuple(session.scalar(select(func.count()).select_from(t))
                       for t in (Run, RegressionRow, AlertRow))  # fmt: skip
    engine.dispose()
    return counts  # type: ignore[return-value]


@pytest.mark.slow
def test_the_regression_loop_of_a_kernel_repository(db_url, tmp_path):
    repo, (good, bad, fix, again) = _repository(tmp_path)
    url = db_url
    first = _nightly(repo, good, url)
    assert first.returncode == 0, first.stdout + first.stderr
    broken = _nightly(repo, bad, url)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "where: seqlen" in broken.stdout  # the run says where it fails

    listed = _cli(repo, "regressions", "--format", "json", "--db", url)
    assert listed.returncode == 0, listed.stderr
    (alert,) = json.loads(listed.stdout)
    engine = open_database(url)
    with Session(engine) as session:
        failing = {r.case.id for r in load_results(session, 2) if r.outcome == "failed"}
    engine.dispose()
    regressions = alert["regressions"]
    assert sorted(r["case_id"] for r in regressions) == sorted(failing)  # one per case
    assert {r["kind"] for r in regressions} == {"new_failure"}
    for reg in regressions:
        usage = [o for o in reg["outputs"] if o["usage"] is not None]
        assert usage and all(o["base_usage"] is not None for o in usage)  # before and after
        assert any(o["usage"] > o["allowed"] > o["base_usage"] for o in usage)
    assert "seqlen" in alert["explanation"][0]["dimensions"]
    assert alert["explanation"][0]["passing_in"] == 0

    # The good checkout is not the code the bad run tested: refused, nothing marked.
    _git(repo, "checkout", "-q", good)
    refused = _cli(repo, "confirm", "2", "--db", url)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert bad in refused.stderr and good in refused.stderr
    (alert,) = json.loads(_cli(repo, "regressions", "--format", "json", "--db", url).stdout)
    assert {r["state"] for r in alert["regressions"]} == {"detected"}
    confirmed = _cli(repo, "confirm", "2", "--checkout", "--db", url)
    assert confirmed.returncode == 1, confirmed.stdout + confirmed.stderr  # reproduced
    (alert,) = json.loads(_cli(repo, "regressions", "--format", "json", "--db", url).stdout)
    assert {r["state"] for r in alert["regressions"]} == {"confirmed"}
    assert alert["confirm_run"] == 3
    engine = open_database(url)
    with Session(engine) as session:
        rerun, base_rerun = session.get(Run, 3), session.get(Run, 4)
        assert (rerun.kind, rerun.kernel_commit) == ("confirm", bad)  # the commit it ran
        # the baseline's commit, rerun where the checkout stands: the change reproduces
        assert (base_rerun.label, base_rerun.kernel_commit) == ("confirm-base:2", good)
    engine.dispose()
    assert "(baseline rerun as run 4)" in confirmed.stdout

    fixed = _nightly(repo, fix, url)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"{len(failing)} fixed (against run 2)" in fixed.stdout  # never the confirm runs
    back = _nightly(repo, again, url)
    assert back.returncode == 1
    assert f"{len(failing)} new, 0 reopened" in back.stdout
    assert "(against run 5, alert" in back.stdout
    # New regressions (one cause each) in the alert of the pair 5 -> 6; the first alert keeps
    # its regressions, fixed.
    latest, first = json.loads(_cli(repo, "regressions", "--format", "json", "--db", url).stdout)
    assert not {r["id"] for r in latest["regressions"]} & {r["id"] for r in regressions}
    assert {r["case_id"] for r in latest["regressions"]} == failing
    assert latest["run_id"] == 6 and latest["baseline_run"] == 5
    assert {r["id"] for r in first["regressions"]} == {r["id"] for r in regressions}
    assert {r["state"] for r in first["regressions"]} == {"fixed"}

    dump = tmp_path / "all.jsonl"
    assert _cli(repo, "export", "--all", "--out", str(dump), "--db", url).returncode == 0
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    assert _cli(repo, "import", str(dump), "--db", copy).returncode == 0
    once = _counts(copy)
    assert once == _counts(url)
    assert _cli(repo, "import", str(dump), "--db", copy).returncode == 0
    assert _counts(copy) == once
