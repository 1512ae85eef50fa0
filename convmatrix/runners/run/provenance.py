"""Which version of the kernel a run tested: the kernel's own code, not the working directory.

Recorded with every run (``RunMeta.kernel_commit``, ``kernel_dirty``, and the version in
``RunMeta.versions``) so that a diff of two runs is a diff of two kernel versions; ``--commit``
overrides it. The code under test is the kernel's ``source_module`` (an adapter names the
library it calls: ``causal_conv1d``, ``vllm``, ``torch_mlu_ops``), else the module that defines
the kernel's class. Its identity is

- the git HEAD (and dirty flag) of the checkout holding that module's file, when git tracks the
  file there (an editable install, a plugin developed in place): the precise version;
- else its distribution's version (``importlib.metadata``), e.g. ``1.7.0``: an installed
  release.

Trap: a virtual environment inside a git checkout (``.venv/`` of this repository) puts
installed packages below a checkout that does not track them; asking git about the directory
would record the checkout's HEAD for a package it never saw, so the file must be tracked.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["KernelIdentity", "git_provenance", "kernel_identity"]


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_provenance(path: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the git checkout that tracks ``path``; (None, None) when no
    checkout does (outside one, or untracked/ignored there, like a package in ``.venv/``)."""
    where = path if path.is_dir() else path.parent
    if _git(where, "ls-files", "--error-unmatch", "--", str(path)) is None:
        return None, None
    head = _git(where, "rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    return head.strip(), None if status is None else bool(status.strip())


@dataclass(frozen=True)
class KernelIdentity:
    """The code a run tested: its module, file, distribution and version, git commit."""

    module: str
    path: str | None = None
    distribution: str | None = None
    version: str | None = None
    commit: str | None = None
    dirty: bool | None = None

    def recorded(self) -> tuple[str | None, bool | None]:
        """(kernel_commit, kernel_dirty) for ``RunMeta``: the commit, else the version."""
        if self.commit:
            return self.commit, self.dirty
        return self.version, None


def _module_file(name: str) -> str | None:
    """The file of module ``name`` without importing it when it is not imported yet."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None or not spec.has_location else spec.origin


def _distribution(name: str) -> tuple[str | None, str | None]:
    """(distribution, version) providing the top-level package of module ``name``.

    A distribution named as the package that does not say it provides another is taken at
    once: ``packages_distributions`` reads every installed distribution's file list, 0.3-0.4 s
    of each run's start-up (every worker's too) with 150 packages installed."""
    top = name.partition(".")[0]
    try:
        named = metadata.distribution(top)
    except metadata.PackageNotFoundError:
        named = None
    if named is not None:
        listed = (named.read_text("top_level.txt") or "").split()
        if not listed or top in listed:
            return named.metadata["Name"], named.version
    candidates = [*metadata.packages_distributions().get(top, []), top]
    for dist in candidates:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def kernel_identity(kernel: Any) -> KernelIdentity:
    """The identity of the code ``kernel`` runs (see the module docstring)."""
    name = getattr(kernel, "source_module", None) or type(kernel).__module__
    path = _module_file(name)
    dist, version = _distribution(name)
    commit, dirty = git_provenance(Path(path)) if path else (None, None)
    return KernelIdentity(name, path, dist, version, commit, dirty)
