"""Sessions: ``nox -s tests`` (the test suite) and ``nox -s matrix`` (the nightly job).

torch is pinned here (2.13.0 has a local CPU wheel on our machines; an unpinned torch pulls a
CUDA build of several GB). pyproject.toml keeps a range so MLU/CUDA users bring their own.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"


def install_project(session: nox.Session, *extras: str) -> None:
    session.install(TORCH)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (SQLite always; PostgreSQL when CONVMATRIX_TEST_PG_URL is set)."""
    install_project(session, "test")
    workers = os.environ.get("CONVMATRIX_TEST_WORKERS", "2")
    session.run("pytest", "-n", workers, *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The nightly job: run the nightly matrix on this machine's devices and write the report.

    Arguments after ``--`` go to ``convmatrix run``.
    """
    install_project(session)
    args = session.posargs or ["--kernel", "tiled"]
    session.run("convmatrix", "run", "--matrix", "nightly", "--report", "reports", *args)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
