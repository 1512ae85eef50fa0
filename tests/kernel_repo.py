"""A kernel in a throwaway git repository, for the commands that must rerun the code a run
tested (``confirm``, ``shrink``: ``convmatrix.pipeline.checkout``).

Two commits of ``repok.py``: ``good`` (the tiled kernel) and ``bad`` (its halo bug: every
length past one tile is wrong), each the class ``repok:Kernel``. The CLI runs as a real
subprocess with the repository first on its import path, so the kernel's provenance is the
repository's HEAD and dirty flag, as for a user's kernel developed in place.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from runner_helpers import child_env, convmatrix_cmd

GOOD = """from convmatrix.kernels.builtin.tiled import TiledKernel


class Kernel(TiledKernel):
    def __init__(self):
        super().__init__()
        self.name = "repok"
"""
BAD = """from convmatrix.kernels.doubles.seeded import CATALOGUE


class Kernel(CATALOGUE["halo_off_by_one"]):  # lengths past one tile read a wrong halo
    def __init__(self):
        super().__init__()
        self.name = "repok"
"""
KERNEL = "repok:Kernel"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip
# Two lengths on each side of the tiled kernel's tile (64): the long one fails on ``bad``.
MATRIX = """name: repo
seed: 0
suites:
  fwd_bwd:
    op: fwd_bwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [8, 100]
      dim: [8]
      batch: [1]
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={**os.environ, **GIT_ENV})  # fmt: skip
    return done.stdout.strip()


def repository(tmp_path: Path) -> tuple[Path, str, str]:
    """(the repository, the good commit, the bad commit); the matrix beside it."""
    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for i, text in enumerate((GOOD, BAD)):
        (repo / "repok.py").write_text(text)
        git(repo, "add", "repok.py")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    (tmp_path / "repo.yaml").write_text(MATRIX)
    return repo, shas[0], shas[1]


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``convmatrix *args`` in ``repo``, importing the kernel from it."""
    env = child_env(PYTHONPATH=f"{repo}{os.pathsep}{child_env()['PYTHONPATH']}")
    return subprocess.run(convmatrix_cmd(*args), cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def nightly(repo: Path, sha: str, url: str) -> subprocess.CompletedProcess[str]:
    """A run of the matrix beside the repository on ``sha``, checked out."""
    git(repo, "checkout", "-q", sha)
    matrix = str(repo.parent / "repo.yaml")
    return cli(repo, "run", "--matrix", matrix, "--kernel", KERNEL, "-n", "0", "--device", "cpu",
               "--db", url)  # fmt: skip
