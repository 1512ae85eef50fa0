"""Sessions: ``nox -s tests`` (the test suite), ``nox -s matrix`` (the nightly job) and
``nox -s docs`` (the documentation site, ``mkdocs build --strict``).

torch is pinned here (2.13.0 has a local CPU wheel on our machines; an unpinned torch pulls a
CUDA build of several GB). pyproject.toml keeps a range so MLU/CUDA users bring their own.
"""

from __future__ import annotations

import os
import re

import nox
from nox.command import CommandFailed

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"


def install_project(session: nox.Session, *extras: str) -> None:
    session.install(TORCH)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def install_project_without_torch(session: nox.Session, *extras: str) -> None:
    """The project and its requirements (from pyproject.toml, extras included) except torch:
    for sessions that never touch a tensor (the docs), so they cannot come to depend on it."""
    project = nox.project.load_toml("pyproject.toml")["project"]
    wanted = [*project["dependencies"]]
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    session.install(*(r for r in wanted if re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0] != "torch"))
    session.install("--no-deps", "-e", ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (SQLite always; PostgreSQL when CONVMATRIX_TEST_PG_URL is set).
    fla-core and Triton come too: the fla adapter's tests run it under the Triton CPU
    interpreter (triton is ~1 GB installed; pip keeps the torch pin); Ray too, for the Ray
    engine's tests on a local two-node cluster.

    A test whose declared component is missing (PostgreSQL, Chromium, fla/Triton, Ray, ...;
    tests/components.py) is skipped, its reason printed (``-rfEs``: failures, errors, skips),
    or fails when ``CI`` is set: .ci/run provides all of them."""
    install_project(session, "test", "fla", "ray")
    workers = os.environ.get("CONVMATRIX_TEST_WORKERS", "2")
    # The slowest tests go in every log (the suite takes about 15 min here; README).
    session.run("pytest", "-n", workers, "-rfEs", "--durations=25", *session.posargs)


EXTRA_ENV = "CONVMATRIX_EXTRA"


def run_arguments(session: nox.Session) -> list[str]:
    """Install the project, and the team's own kernel package where one is named, into the
    session; the arguments for ``convmatrix run`` (posargs after ``--``, ``--kernel tiled``
    unless one is given, ``--confirm`` unless ``--no-confirm`` is).

    A kernel of the team's own (``--kernel pkg.module:Kernel`` or an entry point) lives in a
    package this session's fresh virtualenv does not have: name it with ``--install SPEC``
    after ``--`` (repeatable; a path, a wheel or a requirement, as pip takes it) or in
    ``CONVMATRIX_EXTRA`` (space-separated). It is installed with torch pinned, so pip never
    replaces the torch the run measures."""
    install_project(session)
    try:
        args, extras = _take_option(list(session.posargs), "--install")
    except ValueError as err:
        session.error(str(err))
    extras += os.environ.get(EXTRA_ENV, "").split()
    if extras:
        session.install(TORCH, *extras)
    if _option_value(args, "--kernel") is None:
        args = ["--kernel", "tiled", *args]  # the kernel this project ports; override after --
    # Reproduce before blame: new regressions and the cases the machine failed to judge are
    # rerun (docs/regressions.md); ``-- --no-confirm`` leaves them as the run found them.
    if "--no-confirm" in args:
        args.remove("--no-confirm")
    elif "--confirm" not in args:
        args.append("--confirm")
    return args


def _take_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
    """``args`` without ``name VALUE`` / ``name=VALUE``, and those values in order."""
    kept: list[str] = []
    values: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == name:
            value = next(rest, None)
            if value is None:
                raise ValueError(f"{name} needs a value (a path or requirement for pip)")
            values.append(value)
        elif arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
        else:
            kept.append(arg)
    return kept, values


def _run_matrix(session: nox.Session, matrix: str) -> str | None:
    """Run ``matrix`` (posargs after ``--`` go to ``convmatrix run``; ``run_arguments``), write
    its report and the diff against the previous run of the same kernel (reports/diff.html
    for nightly, reports/diff-<matrix>.html for the others); why it failed, or None."""
    args = run_arguments(session)
    db = _option_value(args, "--db")
    try:
        session.run("convmatrix", "run", "--matrix", matrix, "--report", "reports", *args)
    except CommandFailed as exc:
        if getattr(exc, "return_code", None) != 1:
            raise  # a usage error or an interruption: no new run to compare
        failed: CommandFailed | None = exc
    else:
        failed = None
    # The diff against the previous run of the same kernel, matrix and device (exit 0 and no
    # file when there is none). The run itself decides the session's status.
    name = "diff.html" if matrix == "nightly" else f"diff-{matrix}.html"
    diff = ["convmatrix", "diff", "--previous", "latest", "--out", f"reports/{name}"]
    session.run(*diff, *(["--db", db] if db else []))
    return None if failed is None else f"the {matrix} matrix has failing cases: see reports/"


@nox.session
def matrix(session: nox.Session) -> None:
    """The nightly job: run the nightly matrix on this machine's devices, confirm what it
    found (``--confirm``: new regressions and cases the machine failed to judge rerun; ``--
    --no-confirm`` skips it), write the run report (reports/run-<id>.html) and the diff against
    the previous run of the same kernel (reports/diff.html). Arguments after ``--`` go to
    ``convmatrix run``. With a GPU or MLU
    here, the production matrix (Mamba-sized cases) runs too; on a CPU it stays opt-in
    (``nox -s production``), minutes instead of seconds."""
    failed = [_run_matrix(session, "nightly")]
    if _has_accelerator(session):
        failed.append(_run_matrix(session, "production"))
    if any(failed):
        session.error("; ".join(f for f in failed if f))


def _has_accelerator(session: nox.Session) -> bool:
    probe = "from convmatrix.core.devices import accelerator; print(accelerator()[1])"
    return str(session.run("python", "-c", probe, silent=True)).strip() == "True"


@nox.session
def production(session: nox.Session) -> None:
    """The production matrix (Mamba-sized shapes, docs/verdicts.md): a few minutes
    with ``tiled`` on 2 CPU cores at ``-n 2``; report and diff like ``matrix``."""
    failed = _run_matrix(session, "production")
    if failed:
        session.error(failed)


@nox.session
def perf(session: nox.Session) -> None:
    """The timing job: run the perf matrix (every case timed in three scopes, beside the
    framework path and a memcpy of its bytes), write its report (reports/run-<id>.html) and
    the timing diff against the previous perf runs of the same kernel and device
    (reports/perf-diff.html); fails when a slowdown persists over the last 3 runs against the
    5 before them (``--timing-history``). Arguments after ``--`` go to ``convmatrix run``.
    """
    args = run_arguments(session)
    db = _option_value(args, "--db")
    session.run("convmatrix", "run", "--matrix", "perf", "--report", "reports", *args)
    diff = ["convmatrix", "diff", "--previous", "latest", "--out", "reports/perf-diff.html"]
    diff += ["--timing-history", "5", "--fail-on", "timing-history"]
    session.run(*diff, *(["--db", db] if db else []))


def _option_value(args: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``args`` (the last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ with ``mkdocs build --strict``: a broken link or
    anchor, a page missing from the nav, or a code name or repository path that no longer
    exists (docs_hooks/names_exist.py) fails it. The CLI reference is generated from the
    argument parsers (docs_hooks/); the project is installed without torch, which neither
    the parsers nor the hooks may need (tests/test_layering.py)."""
    install_project_without_torch(session, "docs")
    session.run("python", "-c", "import torch", success_codes=[1], silent=True)  # none here
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session
def device(session: nox.Session) -> None:
    """The device check (benchmarks/device_check.py; docs/devices.md): prepares the wheel
    folder the GPU machine needs (``.whl``, at most 64 MiB: benchmarks/device_wheels.py),
    then runs the check. ``nox -s device -- --dry-run`` runs it on this CPU. On the GPU
    machine itself (no network, no nox) run ``python3 benchmarks/device_check.py --wheels
    .whl`` with the folder carried."""
    install_project(session)
    session.run("python", "benchmarks/device_wheels.py", "--out", ".whl")
    session.run("python", "benchmarks/device_check.py", "--out", "device-check", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
