"""The convmatrix pytest plugin (registered under ``pytest11``): one test item per case.

``pytest --matrix smoke --kernel torch`` (or a ``*.matrix.yaml`` file on the command line with
``--kernel``) collects every case of the matrix as an item with a readable id, runs it
(``convmatrix.runners.case.execute.run_case``) and records the result. Without ``--kernel`` and
``--matrix`` the plugin stays out of the way of ordinary test suites.

Under ``-n N`` (pytest-xdist) each worker owns one device: worker gwN uses device N mod count,
pinned with the CUDA/MLU visibility variables before anything touches the device, and a CPU
worker gets the run's thread policy (``runners.run.threads``: one torch thread by default).
Workers attach each ``CaseResult`` as JSON to the test report (``user_properties``); the
controller, the single recorder, records it (``convmatrix.runners.executors.xdist.session``). A
worker killed by its kernel becomes ``crashed`` for its in-flight case and xdist replaces it; a
case over its time limit becomes ``timeout`` (see ``convmatrix.runners.executors.xdist.watchdog``).
SIGINT/SIGTERM end the session cleanly: every result received so far stays, and the run is marked
``interrupted``.

The controller resolves everything that needs the store (``--resume``) or the devices before
workers start and hands it to them in ``workerinput``, so workers agree on the items.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import warnings
from typing import Any

import pytest

from convmatrix.core.case import Case
from convmatrix.core.devices import cpu_cores
from convmatrix.core.ending import end_when_main_returns
from convmatrix.core.errors import ConvmatrixError
from convmatrix.core.records import CaseResult
from convmatrix.core.sanitise import safe_str, terminal_safe
from convmatrix.core.verdict import describe
from convmatrix.runners.case.execute import run_guarded
from convmatrix.runners.case.interrupts import install_signal_handlers, note_signal
from convmatrix.runners.case.processes import watch_parent
from convmatrix.runners.executors.xdist.session import (
    IN_PROCESS,
    PAYLOAD,
    start_controller,
    stop_after_timeout,
)
from convmatrix.runners.executors.xdist.watchdog import (
    EXIT_STATUS,
    SINGLE_EXIT_STATUS,
    Watchdog,
    quiet,
    witness,
)
from convmatrix.runners.options import add_pytest_options
from convmatrix.runners.run.controller import Prepared
from convmatrix.runners.run.order import largest_first
from convmatrix.runners.run.placement import WorkerPlacement, bind, place_worker
from convmatrix.runners.run.threads import ThreadSetting
from convmatrix.runners.run.workload import Workload

__all__ = ["PAYLOAD", "PREPARED", "CaseItem", "WorkerPlacement", "place_worker"]

PREPARED = pytest.StashKey[Prepared]()
_WORKERINPUT = "convmatrix"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from convmatrix.runners.executors.xdist import hooks

    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("convmatrix", "convmatrix: run a kernel test matrix")
    add_pytest_options(group)  # declared once, in RunOptions


def _asked(config: pytest.Config, name: str) -> bool:
    return bool(config.getoption(f"convmatrix_{name}"))


def _active(config: pytest.Config) -> bool:
    return (
        _asked(config, "matrix")
        or _asked(config, "resume")
        or bool(
            _asked(config, "kernel")
            and any(str(a).split("::")[0].endswith(".matrix.yaml") for a in config.args)
        )
    )


def _is_controller(config: pytest.Config) -> bool:
    return (
        bool(getattr(config.option, "numprocesses", None))
        and getattr(config.option, "dist", "no") != "no"
    )


# -- configuration ------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if _WORKERINPUT in workerinput:
            _matrix_only(config)
            install_signal_handlers()
            watch_parent()  # a SIGKILLed controller leaves no worker running on
            config.stash[PREPARED] = _worker_prepared(workerinput)
            # Once xdist lets the worker go, it ends with no teardown (core.ending): the
            # controller waits on its exit to close the run.
            end_when_main_returns()
        return
    setup = config.hook.pytest_convmatrix_setup(config=config)
    if setup is None and not _active(config):
        return
    if setup is not None or _asked(config, "matrix") or _asked(config, "resume"):
        _matrix_only(config)
    try:
        config.stash[PREPARED] = start_controller(config, setup, _is_controller(config))
    except ConvmatrixError as exc:
        raise pytest.UsageError(str(exc)) from exc
    install_signal_handlers()
    _install_sigterm()


def pytest_unconfigure(config: pytest.Config) -> None:
    """No case runs after this: the hard exit the watchdog keeps armed between cases
    (``watchdog._HardLimit``) must not end the process that goes on (the pipeline's steps,
    a caller of ``pytest.main``)."""
    if config.stash.get(PREPARED, None) is not None:
        quiet()


def _matrix_only(config: pytest.Config) -> None:
    """Run the matrix only, not the tests of the current directory (unless paths were given:
    ``*.matrix.yaml`` files, or tests to run beside the matrix)."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = []


def _worker_prepared(workerinput: dict) -> Prepared:
    """Pin this worker to its device before anything initialises it, then load the same
    workloads as the controller."""
    info = workerinput[_WORKERINPUT]
    kind, count = info["device_kind"], int(info["device_count"])
    where = place_worker(
        str(workerinput["workerid"]),
        int(workerinput["workercount"]),
        kind,
        count,
        cpu_cores(),
        policy=ThreadSetting(**info["threads"]),
    )
    device = bind(where, kind)
    try:
        return Prepared.rebuild(info, device, where.index)
    except ConvmatrixError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand each worker what it must not look up itself."""
    prepared = node.config.stash.get(PREPARED, None)
    if prepared is None:
        return
    node.workerinput[_WORKERINPUT] = prepared.handover()


def _install_sigterm() -> None:
    """SIGTERM (a CI job killed) ends the session like Ctrl-C: results flushed, run
    marked interrupted."""

    def handler(signum: int, frame: Any) -> None:
        note_signal(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, handler)


# -- collection ---------------------------------------------------------------------------------
def pytest_collect_file(file_path: Any, parent: pytest.Collector) -> pytest.Collector | None:
    prepared = parent.config.stash.get(PREPARED, None)
    if prepared is not None and file_path.name.endswith(".matrix.yaml"):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class _CaseSource:
    """Yields one ``CaseItem`` per case of one workload."""

    source: str

    def _items(self: Any) -> list[CaseItem]:
        prepared: Prepared = self.config.stash[PREPARED]
        workload = prepared.workload(self.source)
        return [
            CaseItem.from_parent(self, name=case.pytest_id, case=case, workload=workload)
            for case in workload.cases
        ]


class MatrixFile(_CaseSource, pytest.File):
    """A ``*.matrix.yaml`` file given on the command line (or found in a directory)."""

    def collect(self) -> list[CaseItem]:
        self.source = str(self.path)
        return self._items()


class MatrixCollector(_CaseSource, pytest.Collector):
    """The ``--matrix`` source, collected under the session with the matrix name as nodeid."""

    def collect(self) -> list[CaseItem]:
        return self._items()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    prepared = config.stash.get(PREPARED, None)
    if prepared is None:
        return
    for source in prepared.sources:
        workload = prepared.workload(source)
        collector = MatrixCollector.from_parent(session, name=workload.name, nodeid=workload.name)
        collector.source = source
        items.extend(session.genitems(collector))
    keep, drop = [], []
    for item in items:
        selected = not isinstance(item, CaseItem) or prepared.selects(item.case)
        (keep if selected else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if prepared.largest_first:
        items[:] = largest_first(items, lambda item: getattr(item, "case", None))


# -- running ------------------------------------------------------------------------------------
class CaseFailed(Exception):
    """A judged case that did not pass; its message is the verdict builder's text."""


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, workload: Workload, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.workload = workload

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.workload.name}: {self.case.pytest_id}"

    def _worker(self) -> str:
        workerinput = getattr(self.config, "workerinput", None)
        return "main" if workerinput is None else str(workerinput["workerid"])

    def _deliver(self, result: CaseResult, longrepr: str) -> None:
        """Send a result as a report from outside the normal protocol (the watchdog)."""
        report = pytest.TestReport(
            nodeid=self.nodeid,
            location=self.location,
            keywords={},
            outcome="failed",
            longrepr=longrepr,
            when="call",
            user_properties=[(PAYLOAD, json.dumps(result.to_json()))],
            duration=result.duration_s,
        )
        self.ihook.pytest_runtest_logreport(report=report)
        if getattr(self.config, "workerinput", None) is None:  # single process: nothing runs
            stop_after_timeout(self.config, f"{result.message} ({self.case.pytest_id})")

    def runtest(self) -> None:
        prepared: Prepared = self.config.stash[PREPARED]
        limit = prepared.timeout_s or self.workload.timeout_s
        single = getattr(self.config, "workerinput", None) is None

        def on_timeout() -> None:
            after = "the run stopped here" if single else "worker restarted"
            message = f"no result after {limit:g} s (the per-case limit); {after}"
            result = CaseResult(self.case, "timeout", limit, message, worker=self._worker())
            self._deliver(result, "\n".join(describe(result)))

        seen = witness()
        if seen is not None:
            seen.case(self.case.pytest_id)
        status = SINGLE_EXIT_STATUS if single else EXIT_STATUS
        with Watchdog(limit, on_timeout, status), warnings.catch_warnings(record=True) as caught:
            result = run_guarded(self.case, prepared.context(self.workload))
        if seen is not None:
            seen.idle()
        for w in caught:  # the kernel's warnings, shown escaped in pytest's summary
            warnings.warn_explicit(
                terminal_safe(safe_str(w.message)), w.category, terminal_safe(w.filename), w.lineno
            )
        result.worker = self._worker()
        result.host, result.device_index = socket.gethostname(), prepared.device_index
        self.user_properties.append((PAYLOAD, json.dumps(result.to_json())))
        local = self.config.stash.get(IN_PROCESS, None)
        if local is not None:  # this process records too: no need to parse the JSON back
            local[self.nodeid] = result
        if result.outcome == "skipped":
            pytest.skip(result.message or "skipped")
        if result.outcome != "passed":
            raise CaseFailed("\n".join(describe(result)))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> Any:
        if isinstance(excinfo.value, CaseFailed):  # kernel text: escape sequences shown
            return terminal_safe(str(excinfo.value))
        return super().repr_failure(excinfo, style=style)
