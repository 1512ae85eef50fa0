"""``convmatrix run``: execute a matrix against a kernel and record every result.

A thin front over the pytest plugin (``convmatrix.runners.plugin``): it checks the kernel and
matrix first (so a typo is exit 2 with a clear message, not a pytest traceback), builds the
pytest command line (xdist workers, generous worker restarts, quiet progress) and runs it in
this process. The plugin prints the summary (counts by outcome, worst failures, run id).

Exit status: 0 every case passed (skips allowed), 1 any failed, crashed, timed out or errored,
or the run stopped early, 2 usage or matrix errors, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from convmatrix.errors import UsageError
from convmatrix.kernels.registry import KernelSpecError, load
from convmatrix.runners.plan import load_plan, select_cases

__all__ = ["RunOptions", "add_parser", "pytest_args", "run_command"]

DEVICES = ("auto", "cpu", "cuda", "mlu")
_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


@dataclass
class RunOptions:
    matrix: str | None
    kernel: str | None
    device: str = "auto"
    workers: str = "auto"
    db: str | None = None
    no_db: bool = False
    label: str | None = None
    commit: str | None = None
    cases: Sequence[str] = ()
    resume: str | None = None
    case_timeout: float | None = None
    report: Path | None = None
    verbose: int = 0
    pytest_extra: Sequence[str] = ()


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _workers(spec: str, device: str) -> int:
    """``-n``: a number, or ``auto`` = one worker per device (per core on CPU)."""
    if spec != "auto":
        try:
            n = int(spec)
        except ValueError:
            raise UsageError(f"-n {spec!r}: give a number of workers or 'auto'") from None
        if n < 0:
            raise UsageError(f"-n {n}: the number of workers cannot be negative")
        return n
    from convmatrix.runners.devices import discover, resolve_device

    kind = resolve_device(device).type
    return _cores() if kind == "cpu" else max(1, discover(kind).count)


def _check(opts: RunOptions) -> int:
    """Load kernel, matrix and run once here for clear errors; returns the number of cases."""
    if opts.resume:
        if opts.no_db:
            raise UsageError("--resume needs the database; drop --no-db")
        from convmatrix.runners.recorder import open_resumed

        open_resumed(opts.db, opts.resume)  # names the candidates when RUN matches nothing
        return 0  # the plugin takes matrix and kernel from the stored run
    if not opts.matrix or not opts.kernel:
        raise UsageError("--matrix and --kernel are required (or --resume RUN)")
    try:
        kernel = load(opts.kernel)
    except KernelSpecError as exc:
        raise UsageError(f"--kernel: {exc}") from exc
    return len(select_cases(load_plan(opts.matrix, kernel).cases, opts.cases))


def pytest_args(opts: RunOptions, workers: int, n_cases: int) -> list[str]:
    """The pytest command line for a run: neutral config, quiet progress, our summary only."""
    args = ["-c", os.devnull, "--rootdir", os.getcwd(), "--noconftest", "--assert=plain"]
    args += ["-p", "no:cacheprovider", "--tb=no", "-rN"]
    # Only the plugins a run needs (see _only_our_plugins): xdist and ours.
    args += ["-p", "xdist.plugin", "-p", "convmatrix.runners.plugin"]
    args += ["-v"] * opts.verbose if opts.verbose else ["-q"]
    if workers:
        # A crashed worker is replaced; every case may crash its worker at worst (a resumed
        # run's size is known only to the plugin, hence the large default).
        restarts = (n_cases or 10_000) + workers
        args += ["-n", str(workers), f"--max-worker-restart={restarts}"]
    pairs: list[tuple[str, Any]] = [
        ("--matrix", opts.matrix),
        ("--kernel", opts.kernel),
        ("--device", opts.device),
        ("--db", opts.db),
        ("--label", opts.label),
        ("--commit", opts.commit),
        ("--resume", opts.resume),
        ("--case-timeout", opts.case_timeout),
    ]
    args += [item for flag, value in pairs if value is not None for item in (flag, str(value))]
    args += [item for case in opts.cases for item in ("--case", case)]
    if opts.no_db:
        args.append("--no-db")
    return args + list(opts.pytest_extra)


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


class _Capture:
    """Keeps the pytest config so the run's outcome can be read after ``pytest.main``."""

    config: pytest.Config | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config


def _exit_status(code: int, capture: _Capture) -> int:
    if code == pytest.ExitCode.INTERRUPTED:
        return 130
    if code == pytest.ExitCode.USAGE_ERROR:
        return 2
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("convmatrix run: nothing to run (every selected case already has a result)")
        return 0
    from convmatrix.runners.plugin import STATE
    from convmatrix.runners.summary import BAD_OUTCOMES

    state = None if capture.config is None else capture.config.stash.get(STATE, None)
    if state is None or state.recorder is None:
        return 1
    results = state.recorder.tally.results.values()
    bad = any(r.outcome in BAD_OUTCOMES for r in results)
    info = state.recorder.run_info()
    if info is not None:
        bad = bad or any(info.counts.get(o) for o in BAD_OUTCOMES)
    return 1 if bad or state.recorder.status != "finished" or code != pytest.ExitCode.OK else 0


def _write_report(opts: RunOptions, capture: _Capture) -> None:
    from convmatrix.commands.report import write_run_report
    from convmatrix.runners.plugin import STATE

    state = None if capture.config is None else capture.config.stash.get(STATE, None)
    if state is None or state.recorder is None or state.recorder.run_id is None:
        return
    assert opts.report is not None
    _, html = write_run_report(str(state.recorder.run_id), opts.report, opts.db)
    print(f"report: {html}")


def run_command(opts: RunOptions) -> int:
    """Run the matrix; callable from tests without argv."""
    if opts.device not in DEVICES and opts.device.split(":")[0] not in DEVICES:
        raise UsageError(f"--device {opts.device!r}: one of {', '.join(DEVICES)}")
    if opts.report is not None and opts.no_db:
        raise UsageError("--report reads the run from the database; drop --no-db")
    n_cases = _check(opts)
    workers = _workers(opts.workers, opts.device)
    capture = _Capture()
    with _only_our_plugins():
        code = pytest.main(pytest_args(opts, workers, n_cases), plugins=[capture])
    status = _exit_status(code, capture)
    if opts.report is not None and status != 2:
        _write_report(opts, capture)
    return status


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a matrix against a kernel and record the results",
        description="Run every case of a matrix against a kernel on this machine's devices, "
        "compare with the float64 reference and record the results. Exit 0 when all pass, "
        "1 on failures, 2 on usage or matrix errors.",
    )
    p.add_argument("--matrix", help="built-in matrix name (smoke, nightly), or a file")
    p.add_argument("--kernel", help="registered kernel name or package.module:attribute")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mlu")
    p.add_argument("-n", dest="workers", default="auto", help="worker processes: N or auto")
    p.add_argument("--db", help="database URL (default: $CONVMATRIX_DB, else sqlite)")
    p.add_argument("--no-db", action="store_true", help="do not record (summary only)")
    p.add_argument("--label", help="free-text label stored with the run")
    p.add_argument("--commit", help="kernel commit (default: git HEAD of the kernel source)")
    p.add_argument(
        "--case",
        dest="cases",
        action="extend",
        nargs="+",
        default=[],
        metavar="ID",
        help="run only these cases (id, id prefix or pytest id)",
    )
    p.add_argument("--resume", metavar="RUN", help="run only the cases RUN has no result for")
    p.add_argument("--case-timeout", type=float, help="seconds per case (default: matrix's)")
    p.add_argument("--report", type=Path, metavar="DIR", help="write the HTML report here")
    p.add_argument("-v", "--verbose", action="count", default=0, help="one line per case")
    p.set_defaults(handler=lambda args: run_command(_options(args)))


def _options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        matrix=args.matrix,
        kernel=args.kernel,
        device=args.device,
        workers=args.workers,
        db=args.db,
        no_db=args.no_db,
        label=args.label,
        commit=args.commit,
        cases=args.cases,
        resume=args.resume,
        case_timeout=args.case_timeout,
        report=args.report,
        verbose=args.verbose,
    )
