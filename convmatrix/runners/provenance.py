"""Which version of the kernel a run tested: the git commit of the kernel's source.

Recorded with every run (``RunMeta.kernel_commit``, ``kernel_dirty``) so that a diff of two
runs is a diff of two kernel commits; ``--commit`` overrides it.
"""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["git_provenance", "kernel_provenance"]


def git_provenance(path: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the git checkout holding ``path``; (None, None) outside one."""
    where = path if path.is_dir() else path.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), None if status is None else bool(status.strip())


def kernel_provenance(kernel: Any) -> tuple[str | None, bool | None]:
    """The git commit and dirty flag of the source file that defines ``kernel``'s class."""
    try:
        source = inspect.getsourcefile(type(kernel))
    except TypeError:
        source = None
    return git_provenance(Path(source)) if source else (None, None)
