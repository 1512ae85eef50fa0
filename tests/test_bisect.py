"""``convmatrix bisect`` over a throwaway git repository whose kernel breaks at a known
commit: git bisect run finds exactly that commit, every step is a recorded run, the
repository is left on the commit it was on; a build that fails everywhere is skipped (125)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from runner_helpers import TINY, TINY_L7, child_env, convmatrix_cmd, runs

KERNEL = '''"""A kernel under bisection: the torch path plus OFFSET."""
import torch

from convmatrix.kernels.builtin.framework import TorchKernel

OFFSET = {offset}


class Bisected(TorchKernel):
    name = "bisected"

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        with torch.no_grad():
            y += OFFSET
        return out
# {note}
'''
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip


def _git(repo, *args) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()  # fmt: skip


def _repository(tmp_path, breaks_at: int, commits: int = 7) -> list[str]:
    """Commits 0..commits-1; the kernel is off by 1.0 from commit ``breaks_at`` on."""
    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(commits):
        offset = 1.0 if i >= breaks_at else 0.0
        (repo / "bisectk.py").write_text(KERNEL.format(offset=offset, note=f"commit {i}"))
        _git(repo, "add", "bisectk.py")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


def _bisect(tmp_path, shas, *extra):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["bisect", "--good", shas[0], "--bad", shas[-1], "--case", TINY_L7,
            "--repo", str(tmp_path / "kernel-repo"), "--kernel", "bisectk:Bisected",
            "--matrix", str(TINY), "--device", "cpu", "--db", url, *extra]  # fmt: skip
    done = subprocess.run(convmatrix_cmd(*args), cwd=tmp_path, env=child_env(**GIT_ENV),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    return done, url


def test_bisect_finds_the_commit_that_broke_the_case(tmp_path):
    shas = _repository(tmp_path, breaks_at=4)
    build = f"{shlex.quote(sys.executable)} -c 'import bisectk'"  # a build that checks something
    done, url = _bisect(tmp_path, shas, "--build", build)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"first bad commit {shas[4]}" in done.stdout
    recorded = runs(url)
    assert recorded and all(r.label == f"bisect:{r.kernel_commit}" for r in recorded)
    assert all(r.n_results == 1 and r.kernel == "bisected" for r in recorded)  # the one case
    for r in recorded:  # each step's verdict is the kernel's at that commit
        broken = shas.index(r.kernel_commit) >= 4
        assert (r.counts["failed"] == 1) is broken
    assert shas[4] in {r.kernel_commit for r in recorded}
    assert _git(tmp_path / "kernel-repo", "rev-parse", "HEAD") == shas[-1]  # reset after


def test_a_build_that_fails_everywhere_is_skipped_and_bisect_cannot_tell(tmp_path):
    shas = _repository(tmp_path, breaks_at=2, commits=4)
    done, url = _bisect(tmp_path, shas, "--build", "false")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "could not tell" in done.stdout and "(build failed)" in done.stdout
    assert not os.path.exists(tmp_path / "results.db") or runs(url) == []


def test_bisect_usage_errors(tmp_path):
    shas = _repository(tmp_path, breaks_at=1, commits=2)
    done, _ = _bisect(tmp_path, ["nosuchsha", shas[-1]])
    assert done.returncode == 2 and "nosuchsha" in done.stderr
    (tmp_path / "kernel-repo" / "bisectk.py").write_text("dirty\n")
    done, _ = _bisect(tmp_path, shas)
    assert done.returncode == 2 and "the working tree has changes" in done.stderr
