"""The ``xdist`` executor: the run as one pytest session, its cases as items on xdist workers.

It prepares the run before pytest starts (a typo is exit 2 with a clear message, not a pytest
traceback), hands the prepared run to the plugin (``pytest_convmatrix_setup``), runs pytest
in this process with a neutral configuration and only the plugins a run needs, and returns
the ``RunAccount`` the plugin announces (``pytest_convmatrix_finished``).

The whole executor is this package: the pytest plugin (``plugin``, registered under
``pytest11``), the controller's part of it (``session``), the hooks it adds (``hooks``) and the
per-case time limit (``watchdog``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from convmatrix.core.errors import InfrastructureError, UsageError
from convmatrix.runners.executors.xdist.watchdog import witnessed
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.account import RunAccount
from convmatrix.runners.run.controller import Setup

__all__ = ["XdistExecutor", "pytest_args"]

_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


def pytest_args(request: RunOptions, n_cases: int, verbose: int = 0) -> list[str]:
    """The pytest command line of a run: neutral config, quiet progress, our summary only.
    The run itself (matrix, kernel, cases, resume) travels prepared, not as options."""
    args = ["-c", os.devnull, "--rootdir", os.getcwd(), "--noconftest", "--assert=plain"]
    # No log capture (pytest's logging plugin costs about a millisecond a case): results travel
    # as user_properties, and what a kernel prints is bounded (runners.case.output).
    args += ["-p", "no:cacheprovider", "-p", "no:logging", "--tb=no", "-rN"]
    # Nor pytest's unraisable-exception plugin: it runs gc.collect() at unconfigure and at
    # cleanup, 0.1-0.25 s each with torch's objects in the heap, in every process of a run.
    args += ["-p", "no:unraisableexception"]
    # Only the plugins a run needs (see _only_our_plugins): xdist and ours.
    args += ["-p", "xdist.plugin", "-p", "convmatrix.runners.executors.xdist.plugin"]
    args += ["-v"] * verbose if verbose else ["-q"]
    workers = int(request.workers)
    if workers:
        # A crashed worker is replaced; every case may crash its worker at worst.
        restarts = n_cases + workers
        args += ["-n", str(workers), f"--max-worker-restart={restarts}"]
        # The cases the largest first, each worker on half of them, an idle worker taking the
        # tail of the busiest one's queue: no large case starts last (runners.run.order).
        args += ["--dist", "worksteal"]
    return args


@contextlib.contextmanager
def _only_our_plugins() -> Iterator[None]:
    """No auto-loaded third-party pytest plugins in the run (workers inherit this too): they
    cost seconds of start-up and summary time (hypothesis, benchmark, ...) and none applies."""
    saved = os.environ.get(_AUTOLOAD)
    os.environ[_AUTOLOAD] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[_AUTOLOAD]
        else:
            os.environ[_AUTOLOAD] = saved


class _Handover:
    """The executor's side of the plugin's hooks: the prepared run in, the account out."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.account: RunAccount | None = None

    def pytest_convmatrix_setup(self, config: pytest.Config) -> Setup:
        return self.setup

    def pytest_convmatrix_finished(self, config: pytest.Config, account: RunAccount) -> None:
        self.account = account


class XdistExecutor:
    """``verbose``: pytest's -v count; ``extra``: more pytest arguments (tests, debugging)."""

    def __init__(self, verbose: int = 0, extra: Sequence[str] = (), **_: Any) -> None:
        self.verbose = verbose
        self.extra = list(extra)

    def run(self, setup: Setup) -> RunAccount:
        n_cases = len(setup.prepared.planned())
        handover = _Handover(setup)
        args = [*pytest_args(setup.request, n_cases, self.verbose), *self.extra]
        # -n 0: the kernel runs in this process; a witness speaks if it dies mid-case
        with _only_our_plugins(), witnessed(int(setup.request.workers) == 0):
            code = pytest.main(args, plugins=[handover])
        return _account(code, handover.account)


def _account(code: Any, account: RunAccount | None) -> RunAccount:
    if account is None and code == pytest.ExitCode.USAGE_ERROR:
        raise UsageError("pytest refused the run (its message is above)")
    if account is None:  # the executor failed under the run: infrastructure (exit 3)
        raise InfrastructureError(f"the run ended before it was recorded (pytest exit {int(code)})")
    # With an account, pytest's 4 is the session's "nothing judged" (``session``), which the
    # account says itself: the account decides the exit status.
    if code == pytest.ExitCode.INTERNAL_ERROR:  # pytest or xdist failed, not a case: exit 3
        kept = f"run {account.run_id} kept: --resume runs the rest; " if account.run_id else ""
        raise InfrastructureError(f"the executor failed under the run ({kept}INTERNALERROR above)")
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("convmatrix run: nothing to run (every selected case already has a result)")
    return account
