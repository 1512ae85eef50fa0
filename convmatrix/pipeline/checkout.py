"""The code a recorded run tested, for the commands that run it again (``confirm``, ``shrink``).

A rerun of a run's cases answers a question about the kernel the run tested, or none: the
kernel's checkout here must stand at the commit the run recorded, without local changes the
run did not have. When it does not, the command refuses with both commits named, or, asked
to (``--checkout``), runs from a temporary git worktree at the recorded commit, in a process
of its own whose import path starts there (this process has the other code imported already).
One check serves every such command (``recorded_code``), so they can never disagree on what
"the same code" means.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from convmatrix.core.errors import UsageError
from convmatrix.db.queries import RunInfo
from convmatrix.runners.run.controller import load_kernel
from convmatrix.runners.run.provenance import KernelIdentity, kernel_identity
from convmatrix.service.bisect import git

__all__ = ["recorded_code", "stands_at", "worktree_env"]


def stands_at(run: RunInfo, identity: KernelIdentity) -> str | None:
    """Why the kernel's code here is not the code ``run`` tested; None when it is (or when
    nothing was recorded to hold it to, or nothing can be told here)."""
    recorded = run.kernel_commit
    commit, dirty = identity.recorded()
    if recorded is None or commit is None:
        return None
    where = f" ({Path(identity.path).parent})" if identity.path else ""
    if commit != recorded:
        return (
            f"run {run.id} tested kernel commit {recorded}; the kernel's checkout{where} is "
            f"at {commit}"
        )
    if dirty and not run.kernel_dirty:  # a run made dirty is rerun dirty, and recorded so
        return (
            f"run {run.id} tested kernel commit {recorded}; the kernel's checkout{where} is "
            f"at {commit} with local changes"
        )
    return None


@contextmanager
def _worktree(identity: KernelIdentity, commit: str) -> Iterator[Path]:
    """A temporary worktree of the kernel's repository at ``commit``; yields the directory
    to put first on the import path there (where the kernel's top-level package lives)."""
    if identity.path is None:
        raise UsageError(f"--checkout: the kernel's module {identity.module} has no file")
    source = Path(identity.path).resolve()
    top = Path(git(source.parent, "rev-parse", "--show-toplevel").stdout.strip())
    depth = len(identity.module.split(".")) - (0 if source.name == "__init__.py" else 1)
    root = source.parents[depth] if depth < len(source.parents) else source.parent
    scratch = Path(tempfile.mkdtemp(prefix="convmatrix-checkout-"))
    tree = scratch / "worktree"
    git(top, "worktree", "add", "--detach", str(tree), commit)
    try:
        yield tree / root.relative_to(top)
    finally:
        subprocess.run(["git", "-C", str(top), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def recorded_code(
    run: RunInfo, kernel_spec: str, command: str, *, checkout: bool
) -> Iterator[Path | None]:
    """Where the code ``run`` tested is: ``None`` here (the kernel's checkout stands at the
    run's commit), or, with ``checkout``, the import root of a temporary worktree at that
    commit (removed on leaving). Otherwise a ``UsageError`` naming both commits, before
    anything was run."""
    identity = kernel_identity(load_kernel(kernel_spec))
    why = stands_at(run, identity)
    if why is None:
        yield None
        return
    if not checkout:
        raise UsageError(
            f"{command}: {why}: check out {run.kernel_commit} there, or pass --checkout to run "
            "it from a temporary worktree at that commit (nothing was run or changed)"
        )
    assert run.kernel_commit is not None  # stands_at says nothing without one
    with _worktree(identity, run.kernel_commit) as root:
        yield root


def worktree_env(root: Path) -> dict[str, str]:
    """This process's environment with ``root`` first on the import path (the worktree's
    kernel, not the one imported here)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return env
