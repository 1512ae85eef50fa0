"""The components this project declares, and what happens to a test when one is missing.

Locally, a test whose component is missing is skipped with the reason (``nox -s tests`` prints
skip reasons: ``-rs``). Under CI (``CI`` set and not false) the same test fails, naming the
component: CI provides every one of them (``.ci/run``, ``noxfile.py``), so a missing one means
the run did not test what it claims to, and a green run must not hide that.

Declared Python packages a test can simply import (torch, the ``test`` extra: Starlette,
Playwright, SciPy, ...) are plain imports: missing or broken, they fail collection everywhere.
``COMPONENTS`` lists those too (one place for the whole set), and the ones a test can only
find at run time: a server (PostgreSQL), a program (Chromium), and the extras that part of the
suite must run without (fla/Triton, Ray).

A component CI cannot provide (``in_ci=False``: a second Triton, for fla released before
Triton 3.9 dropped block pointers) is skipped under CI too, the skip naming what covers it
instead (``provided_by``), so CI stays green on what it can run and says what it did not.

Use ``@pytest.mark.requires("chromium", ...)`` on a test (or in ``pytestmark``), or
``require("postgresql")`` in a fixture; ``missing(name, reason)`` when a test finds out itself
(an installed library that does not load). A skip for any other reason (a CUDA device present,
Triton compiled rather than interpreted) is not a missing component and stays a skip.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

PG_ENV = "CONVMATRIX_TEST_PG_URL"
CHROMIUM_ENV = "CONVMATRIX_CHROMIUM"
# The start of the failure message under CI; the terminal summary finds components by it.
MISSING = "declared component missing under CI:"
_MISSING_RE = re.compile(re.escape(MISSING) + r" ([\w-]+)")


def under_ci() -> bool:
    """Whether ``CI`` is set to something other than empty/0/false/no/off."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def chromium_path() -> str:
    """Where the browser tests look for Chromium (``CONVMATRIX_CHROMIUM`` overrides)."""
    return os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or "/usr/bin/chromium"


def _postgresql() -> str | None:
    if os.environ.get(PG_ENV):
        return None
    return f"{PG_ENV} is unset: no PostgreSQL server to test against (.ci/run sets it)"


def _chromium() -> str | None:
    path = chromium_path()
    if Path(path).exists():
        return None
    return f"no Chromium at {path} (apt-get install chromium; .ci/run does)"


def _postgresql_server() -> str | None:
    # tests/private_postgres.py: a private server a test may stop and start again.
    from private_postgres import postgres_bin

    if postgres_bin() is None:
        return "no initdb/pg_ctl in /usr/lib/postgresql/*/bin or PATH (apt-get install postgresql)"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return None


def _mount_tmpfs() -> str | None:
    if not sys.platform.startswith("linux"):
        return "mounting a tmpfs needs Linux"
    if os.geteuid() != 0:
        return "mounting a small tmpfs (a disk that fills up) needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount"
    return None


def _package(module: str, install: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        # Looked up without importing: fla must be imported only after the adapter has chosen
        # the Triton interpreter (convmatrix.kernels.adapters.fla).
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({install})"
        return None

    return probe


@dataclass(frozen=True)
class Component:
    what: str  # what the tests need
    provided_by: str  # where CI gets it (or, when not in_ci, what covers it instead)
    probe: Callable[[], str | None]  # None when present, else why it is not
    # False: CI cannot provide it (a second Triton beside the one the fla extra installs);
    # its tests skip there too, and ``provided_by`` names what covers them.
    in_ci: bool = True


BLOCK_PTR_PYTHON_ENV = "CONVMATRIX_TEST_BLOCK_PTR_PYTHON"


def _block_ptr_python() -> str | None:
    python = os.environ.get(BLOCK_PTR_PYTHON_ENV)
    if not python:
        return (
            f"{BLOCK_PTR_PYTHON_ENV} is unset: no Python whose Triton still runs "
            "tl.make_block_ptr (docs/peers.md: a venv with triton==3.6.0)"
        )
    if not os.access(python, os.X_OK):
        return f"{BLOCK_PTR_PYTHON_ENV}={python} is not an executable"
    return None


COMPONENTS: dict[str, Component] = {
    "postgresql": Component(
        f"the PostgreSQL server at ${PG_ENV}", ".ci/run starts one and exports the URL", _postgresql
    ),
    "postgresql-server": Component(
        "PostgreSQL's server programs (initdb, pg_ctl) to start a private server a test can "
        "stop mid-run",
        ".ci/run installs postgresql and runs as root (the server runs as postgres)",
        _postgresql_server,
    ),
    "tmpfs": Component(
        "root, to mount a small tmpfs that a run's database fills up",
        ".ci/run runs as root",
        _mount_tmpfs,
    ),
    "chromium": Component(
        "headless Chromium", "Debian's chromium, installed by .ci/run", _chromium
    ),
    "playwright": Component(
        "Playwright (drives Chromium)",
        "the test extra",
        _package("playwright", "pip install 'convmatrix[test]'"),
    ),
    "starlette": Component(
        "Starlette (convmatrix serve)",
        "the test extra",
        _package("starlette", "pip install 'convmatrix[test]'"),
    ),
    "ray": Component(
        "Ray (the Ray engine)", "the ray extra", _package("ray", "pip install 'convmatrix[ray]'")
    ),
    "fla": Component(
        "fla-core (the fla adapter)",
        "the fla extra",
        _package("fla", "pip install 'convmatrix[fla]'"),
    ),
    "triton": Component(
        "Triton (its CPU interpreter runs fla's kernels)",
        "the fla extra",
        _package("triton", "pip install 'convmatrix[fla]'"),
    ),
    "fla-releases": Component(
        "fla's PyPI releases, one per layout, unpacked (CONVMATRIX_FLA_RELEASES names a "
        "directory of them; else pip download --no-deps into pytest's cache)",
        "PyPI, downloaded by tests/test_fla.py (a few wheels under 1 MB)",
        lambda: None,  # the fixture finds out (downloads) and calls missing() itself
    ),
    "triton-block-ptr": Component(
        "a second Python (a venv with convmatrix and triton 3.6) whose Triton runs "
        "tl.make_block_ptr, for fla released before 2026-07-25",
        "benchmarks/real_history.py, which runs every fla release under it (docs/peers.md); "
        "CI installs one Triton, the newest, with the fla extra",
        _block_ptr_python,
        in_ci=False,
    ),
    "torch": Component(
        "torch", "a core dependency (noxfile.py pins it)", _package("torch", "pip install torch")
    ),
}


def missing(name: str, reason: str) -> NoReturn:
    """The component ``name`` is missing: skip (locally) or fail (under CI), with ``reason``."""
    if name not in COMPONENTS:
        raise ValueError(f"{name!r} is not a declared component (tests/components.py)")
    if under_ci() and COMPONENTS[name].in_ci:
        pytest.fail(f"{MISSING} {name}: {reason}", pytrace=False)
    covered = (
        ""
        if COMPONENTS[name].in_ci
        else f" (not in CI; covered by: {COMPONENTS[name].provided_by})"
    )
    pytest.skip(f"needs {name}: {reason}{covered}")


def require(*names: str) -> None:
    """Skip or fail (see ``missing``) unless every named component is present."""
    for name in names:
        if name not in COMPONENTS:
            raise ValueError(f"{name!r} is not a declared component (tests/components.py)")
        reason = COMPONENTS[name].probe()
        if reason is not None:
            missing(name, reason)


# -- the pytest plugin (registered in conftest.py) -------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*components): needs these declared components (tests/components.py); "
        "skipped without them, failed under CI",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        require(*mark.args)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Under CI, one section naming each missing component and the tests that needed it."""
    tests: dict[str, list[str]] = defaultdict(list)
    for key in ("failed", "error"):
        for report in terminalreporter.stats.get(key, []):
            found = _MISSING_RE.search(getattr(report, "longreprtext", "") or "")
            if found:
                tests[found.group(1)].append(report.nodeid)
    if not tests:
        return
    terminalreporter.section("declared components missing under CI", red=True)
    for name, nodeids in sorted(tests.items()):
        more = f" and {len(nodeids) - 5} more" if len(nodeids) > 5 else ""
        shown = ", ".join(nodeids[:5]) + more
        where = COMPONENTS[name].provided_by
        terminalreporter.line(f"{name} ({where}): {len(nodeids)} test(s) failed for it: {shown}")
