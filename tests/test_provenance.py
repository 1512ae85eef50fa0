"""The kernel's identity recorded with a run (convmatrix.runners.run.provenance): the git HEAD of
the checkout that tracks the kernel's module (not the working directory's), else its
distribution's version; ``--commit`` overrides. Real git repositories and real dist-info
directories in tmp_path, the kernel loaded by its ``module:attribute`` spec."""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from convmatrix.kernels import load
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import prepare, run_meta
from convmatrix.runners.run.provenance import git_provenance, kernel_identity
from convmatrix.runners.run.store import MemoryStore

TINY = Path(__file__).parent / "resources" / "matrices" / "tiny.matrix.yaml"

KERNEL_SOURCE = """
from convmatrix.kernels.builtin.framework import TorchKernel


class Kernel(TorchKernel):
    name = "{name}"
"""


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _package(root: Path, name: str, version: str | None = None) -> Path:
    """A kernel package ``name`` under ``root`` (plus a dist-info of ``version``)."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(KERNEL_SOURCE.format(name=name), encoding="utf-8")
    if version:
        info = root / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(f"{name}\n")
    return pkg


def _committed(repo: Path, name: str, version: str) -> str:
    """A git repository holding kernel package ``name``, committed; its HEAD."""
    _package(repo, name, version=version)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "kernel")
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def on_path(monkeypatch):
    def add(root: Path) -> None:
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()

    yield add
    for name in [m for m in sys.modules if m.startswith("cmk_")]:
        del sys.modules[name]


def test_a_kernel_in_a_git_checkout_records_that_checkouts_head(tmp_path, on_path):
    repo = tmp_path / "kernel_repo"
    head = _committed(repo, "cmk_git", "0.3.0")
    on_path(repo)
    identity = kernel_identity(load("cmk_git:Kernel"))
    assert (identity.module, identity.commit, identity.dirty) == ("cmk_git", head, False)
    assert (identity.distribution, identity.version) == ("cmk_git", "0.3.0")
    assert identity.recorded() == (head, False)
    (repo / "cmk_git" / "__init__.py").write_text("# edited\n", encoding="utf-8")
    assert git_provenance(repo / "cmk_git" / "__init__.py") == (head, True)


def test_an_installed_kernel_records_its_distribution_version(tmp_path, on_path):
    site = tmp_path / "site-packages"
    _package(site, "cmk_dist", version="1.2.3")
    on_path(site)
    identity = kernel_identity(load("cmk_dist:Kernel"))
    assert (identity.commit, identity.version, identity.recorded()) == (
        None,
        "1.2.3",
        ("1.2.3", None),
    )


def _dist_info(root: Path, dist: str, version: str, provides: str) -> None:
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"  # as pip names it
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{provides}\n")
    (info / "RECORD").write_text(f"{provides}/__init__.py,,\n")


def test_the_distribution_is_the_one_that_provides_the_package(tmp_path, on_path):
    """cmk_other's distribution is named otherwise (as PyYAML provides yaml), and a
    distribution named cmk_other exists that provides another package: the version recorded
    is the providing one's, found through every distribution's file list."""
    site = tmp_path / "site-packages"
    _package(site, "cmk_other")
    _dist_info(site, "cmk-provider", "4.5.6", provides="cmk_other")
    _dist_info(site, "cmk_other", "9.9.9", provides="cmk_unrelated")
    on_path(site)
    identity = kernel_identity(load("cmk_other:Kernel"))
    assert (identity.distribution, identity.version) == ("cmk-provider", "4.5.6")


def test_a_package_ignored_by_the_checkout_around_it_is_not_given_that_head(tmp_path, on_path):
    """The .venv trap: site-packages inside a git checkout that does not track it."""
    repo = tmp_path / "project"
    site = repo / ".venv" / "site-packages"
    _package(site, "cmk_venv", version="2.0.1")
    (repo / ".gitignore").write_text(".venv/\n", encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".gitignore")
    _git(repo, "commit", "-q", "-m", "project")
    on_path(site)
    assert git_provenance(site / "cmk_venv" / "__init__.py") == (None, None)
    assert kernel_identity(load("cmk_venv:Kernel")).recorded() == ("2.0.1", None)


def test_an_adapter_names_the_library_it_calls():
    identity = kernel_identity(load("dao"))
    assert identity.module == "causal_conv1d"
    if identity.path is None:  # not installed here: nothing to record, nothing made up
        assert identity.recorded() == (None, None)


def test_run_meta_records_the_kernels_identity_and_commit_overrides_it(
    tmp_path, on_path, monkeypatch
):
    repo = tmp_path / "kernel_repo"
    head = _committed(repo, "cmk_meta", "0.9.0")
    on_path(repo)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory is no checkout at all
    request = RunOptions(matrix=str(TINY), kernel="cmk_meta:Kernel", device="cpu").checked()
    meta = run_meta(prepare(request, MemoryStore()), request, 4)
    assert (meta.kernel_commit, meta.kernel_dirty) == (head, False)
    assert meta.versions["cmk_meta"] == "0.9.0"
    request = replace(request, commit="0123abcd")
    meta = run_meta(prepare(request, MemoryStore()), request, 4)
    assert (meta.kernel_commit, meta.kernel_dirty) == ("0123abcd", None)
