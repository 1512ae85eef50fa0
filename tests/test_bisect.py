"""``convmatrix bisect`` over a throwaway git repository whose kernel breaks at a known
commit: git bisect run finds exactly that commit, every step is a recorded run, the
repository is left on the commit it was on. Only judged commits are named: a build that
fails, or a commit whose kernel does not import, is skipped (125), and where only such
commits are left at the boundary, or an endpoint is not what it was said to be, bisect ends
"cannot decide" (exit 4) instead of naming a commit it did not judge."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from runner_helpers import TINY, TINY_L7, child_env, convmatrix_cmd, runs

from convmatrix.core.errors import NotJudgedError

CANNOT_DECIDE = NotJudgedError.exit_code  # 4, the "nothing judged" of core.errors.EXIT_CODES

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


# A commit whose kernel module does not import (as fla's did under a Triton that had
# dropped ``tl.make_block_ptr``): an AttributeError at import, not a usage error.
NO_IMPORT = """raise AttributeError("module 'triton.language' has no attribute 'make_block_ptr'")
# {note}
"""


def _repository(tmp_path, breaks_at: int, commits: int = 7, no_import=()) -> list[str]:
    """Commits 0..commits-1; the kernel is off by 1.0 from commit ``breaks_at`` on, and its
    module does not import at the commits in ``no_import``."""
    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(commits):
        offset = 1.0 if i >= breaks_at else 0.0
        source = NO_IMPORT if i in no_import else KERNEL
        (repo / "bisectk.py").write_text(source.format(offset=offset, note=f"commit {i}"))
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
    assert f"  {shas[0][:12]} good [--good]" in done.stdout  # the endpoints judged first
    assert f"  {shas[-1][:12]} bad [--bad]" in done.stdout
    recorded = runs(url)
    assert recorded and all(r.label == f"bisect:{r.kernel_commit}" for r in recorded)
    assert all(r.n_results == 1 and r.kernel == "bisected" for r in recorded)  # the one case
    for r in recorded:  # each step's verdict is the kernel's at that commit
        broken = shas.index(r.kernel_commit) >= 4
        assert (r.counts["failed"] == 1) is broken
    assert shas[4] in {r.kernel_commit for r in recorded}
    assert _git(tmp_path / "kernel-repo", "rev-parse", "HEAD") == shas[-1]  # reset after


def test_a_build_that_fails_everywhere_is_skipped_and_bisect_cannot_decide(tmp_path):
    shas = _repository(tmp_path, breaks_at=2, commits=4)
    done, url = _bisect(tmp_path, shas, "--build", "false")
    assert done.returncode == CANNOT_DECIDE, done.stdout + done.stderr
    assert f"  {shas[0][:12]} skipped (build failed) [--good]" in done.stdout
    assert f"bisect: cannot decide: --good {shas[0][:12]} is skipped (build failed)" in (
        done.stdout
    )
    assert not os.path.exists(tmp_path / "results.db") or runs(url) == []


def test_a_middle_commit_that_does_not_import_next_to_the_break_cannot_be_decided(tmp_path):
    """Commit 2 does not import, commit 3 breaks the case: the first bad commit is 2 or 3 and
    no step can tell which. Before, the import error was exit 1 (a traceback), a "bad" step,
    and bisect named commit 2, which it never judged."""
    shas = _repository(tmp_path, breaks_at=3, commits=5, no_import={2})
    done, url = _bisect(tmp_path, shas)
    assert done.returncode == CANNOT_DECIDE, done.stdout + done.stderr
    assert "first bad commit" not in done.stdout
    assert f"  {shas[2][:12]} skipped (nothing judged)" in done.stdout
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("bisect: cannot decide: ")]
    assert "only commits that judged nothing are left" in line
    assert shas[2][:12] in line and shas[3][:12] in line
    stepped = {r.kernel_commit for r in runs(url)}  # recorded runs: judged commits only
    assert shas[0] in stepped and shas[-1] in stepped and shas[2] not in stepped
    assert _git(tmp_path / "kernel-repo", "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_a_commit_that_does_not_import_away_from_the_break_is_skipped(tmp_path):
    shas = _repository(tmp_path, breaks_at=5, commits=7, no_import={3})
    done, _ = _bisect(tmp_path, shas)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"  {shas[3][:12]} skipped (nothing judged)" in done.stdout
    assert f"bisect: first bad commit {shas[5]} (judged bad, its parent good" in done.stdout


def test_a_good_endpoint_that_fails_the_case_cannot_be_decided(tmp_path):
    """git bisect trusts --good and --bad without running them: given a --good where the
    case already fails it named the commit after --good, which it never judged."""
    shas = _repository(tmp_path, breaks_at=1, commits=4)
    done, _ = _bisect(tmp_path, shas[1:])  # the case already fails at --good
    assert done.returncode == CANNOT_DECIDE, done.stdout + done.stderr
    assert f"bisect: cannot decide: --good {shas[1][:12]} is bad, not good" in done.stdout
    assert _git(tmp_path / "kernel-repo", "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_a_bad_endpoint_that_judges_nothing_cannot_be_decided(tmp_path):
    shas = _repository(tmp_path, breaks_at=2, commits=4, no_import={3})
    done, _ = _bisect(tmp_path, shas)
    assert done.returncode == CANNOT_DECIDE, done.stdout + done.stderr
    assert f"--bad {shas[3][:12]} is skipped (nothing judged), not bad" in done.stdout


def test_bisect_usage_errors(tmp_path):
    shas = _repository(tmp_path, breaks_at=1, commits=2)
    done, _ = _bisect(tmp_path, ["nosuchsha", shas[-1]])
    assert done.returncode == 2 and "nosuchsha" in done.stderr
    (tmp_path / "kernel-repo" / "bisectk.py").write_text("dirty\n")
    done, _ = _bisect(tmp_path, shas)
    assert done.returncode == 2 and "the working tree has changes" in done.stderr
