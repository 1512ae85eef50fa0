"""The convmatrix pytest plugin (registered under ``pytest11``): one test item per case.

``pytest --matrix smoke --kernel torch`` (or a ``*.matrix.yaml`` file on the command line with
``--kernel``) collects every case of the matrix as an item with a readable id, runs it
(``convmatrix.runners.execute.run_case``) and records the result. Without ``--kernel`` and
``--matrix`` the plugin stays out of the way of ordinary test suites.

Under ``-n N`` (pytest-xdist) each worker owns one device: worker gwN uses device N mod count,
pinned with the CUDA/MLU visibility variables before anything touches the device, and a CPU
worker gets cores // workers torch threads. Workers attach each ``CaseResult`` as JSON to
the test report (``user_properties``); the controller, the single database writer, records it
(``convmatrix.runners.recorder``). A worker killed by its kernel becomes ``crashed`` for its
in-flight case and xdist replaces it; a case over its time limit becomes ``timeout`` (see
``convmatrix.runners.watchdog``). SIGINT/SIGTERM end the session cleanly: every result
received so far stays, and the run is marked ``interrupted``.

The controller resolves everything that needs the database (``--resume``) or the devices
before workers start and hands it to them in ``workerinput``, so workers agree on the items.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from convmatrix.errors import ConvmatrixError
from convmatrix.kernels.registry import KernelSpecError, load
from convmatrix.matrix.case import Case
from convmatrix.runners.execute import Context, run_case
from convmatrix.runners.plan import Plan, load_plan, select_cases
from convmatrix.runners.results import CaseResult
from convmatrix.runners.verdict import describe
from convmatrix.runners.watchdog import Watchdog

__all__ = ["PAYLOAD", "STATE", "CaseItem", "RunnerState", "WorkerPlacement", "place_worker"]

PAYLOAD = "convmatrix_result"  # user_properties key of the JSON CaseResult
_WORKERINPUT = "convmatrix"


@dataclass
class RunnerState:
    """What the plugin knows in this process; ``role`` is single, controller or worker."""

    role: str
    kernel: Any
    kernel_spec: str
    plans: dict[str, Plan]  # by source
    matrix_sources: list[str]  # the --matrix sources (files given as args collect themselves)
    wanted: list[str]  # --case values (empty: every case)
    done: set[str]  # ids a resumed run already holds
    device_spec: str
    device: torch.device
    device_count: int = 1
    timeout_s: float | None = None  # --case-timeout overrides the matrix's
    recorder: Any = None  # controller / single process only
    planned: set[str] = field(default_factory=set)  # ids of the known plans' selected cases
    by_pytest_id: dict[str, Case] = field(default_factory=dict)
    interrupted: bool = False

    def selects(self, case: Case) -> bool:
        """Whether this session runs ``case`` (same answer on the controller and workers)."""
        if case.id in self.done:
            return False
        return not self.wanted or bool(select_cases([case], self.wanted, strict=False))

    def context(self, plan: Plan) -> Context:
        return Context(self.kernel, plan.tolerances, plan.policy, self.device, timing=plan.timing)

    def plan_for(self, source: str) -> Plan:
        if source not in self.plans:
            self.plans[source] = load_plan(source, self.kernel)
            self.by_pytest_id.update((c.pytest_id, c) for c in self.plans[source].cases)
        return self.plans[source]


STATE = pytest.StashKey[RunnerState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("convmatrix", "convmatrix: run a kernel test matrix")
    group.addoption("--matrix", help="built-in matrix name, matrix file or cases .jsonl")
    group.addoption("--kernel", help="registered kernel name or package.module:attribute")
    group.addoption(
        "--device", default="auto", help="auto, cpu, cuda or mlu (with -n: one per worker)"
    )
    group.addoption("--db", help="results database URL (default CONVMATRIX_DB or sqlite)")
    group.addoption("--no-db", action="store_true", help="record nothing (summary only)")
    group.addoption("--label", help="free-text label stored with the run")
    group.addoption("--commit", help="kernel commit (default: git HEAD of the kernel's source)")
    group.addoption("--case", action="append", default=[], dest="cm_cases", help="run one case")
    group.addoption("--resume", help="run id (or latest/label/commit): run its missing cases")
    group.addoption("--case-timeout", type=float, help="seconds per case (default: matrix's)")


def _active(config: pytest.Config) -> bool:
    return bool(config.getoption("matrix") or config.getoption("resume")) or bool(
        config.getoption("kernel")
        and any(str(a).split("::")[0].endswith(".matrix.yaml") for a in config.args)
    )


def _is_controller(config: pytest.Config) -> bool:
    return (
        bool(getattr(config.option, "numprocesses", None))
        and getattr(config.option, "dist", "no") != "no"
    )


def _load_kernel(spec: str | None) -> Any:
    if not spec:
        raise pytest.UsageError("convmatrix: --kernel is required (e.g. --kernel torch)")
    try:
        return load(spec)
    except KernelSpecError as exc:
        raise pytest.UsageError(f"--kernel: {exc}") from exc


# -- configuration ------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    matrix_only = config.getoption("matrix") or config.getoption("resume")
    if matrix_only and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = []  # run the matrix only, not the tests of the current directory
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if _WORKERINPUT in workerinput:
            config.stash[STATE] = _worker_state(config, workerinput)
        return
    if not _active(config):
        return
    try:
        from convmatrix.runners.session import controller_state  # imports the database layer

        config.stash[STATE] = controller_state(config, _is_controller(config))
    except ConvmatrixError as exc:
        raise pytest.UsageError(str(exc)) from exc
    _install_sigterm()


@dataclass(frozen=True)
class WorkerPlacement:
    """Where an xdist worker runs: its device, the visibility variables, its torch threads."""

    device: str  # "cpu", "cuda:0", "mlu:0" (torch.device("mlu") needs torch_mlu imported)
    env: dict[str, str]
    threads: int | None  # None: leave torch's default (accelerator workers)


def place_worker(
    worker_id: str, workers: int, kind: str, count: int, cores: int, environ: dict | None = None
) -> WorkerPlacement:
    """Worker gwN owns device N mod count, which it then sees as device 0; a CPU worker gets
    cores // workers threads (torch's default, every core, oversubscribes them ~3x)."""
    from convmatrix.runners.devices import visible_devices_env

    number = int(worker_id.lstrip("gw") or 0)
    env = visible_devices_env(kind, number % max(1, count), environ)
    if kind == "cpu":
        return WorkerPlacement("cpu", env, max(1, cores // max(1, workers)))
    return WorkerPlacement(f"{kind}:0", env, None)


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _worker_state(config: pytest.Config, workerinput: dict) -> RunnerState:
    """Pin this worker to its device before anything initialises it, then load the same plans."""
    info = workerinput[_WORKERINPUT]
    kind, count = info["device_kind"], int(info["device_count"])
    where = place_worker(
        str(workerinput["workerid"]), int(workerinput["workercount"]), kind, count, _cores()
    )
    os.environ.update(where.env)
    if where.threads is not None:
        torch.set_num_threads(where.threads)
    else:
        from convmatrix.runners.devices import backend_module

        backend_module(kind)  # registers torch.mlu (imports torch_mlu) after the pinning
    kernel = _load_kernel(info["kernel"])
    state = RunnerState(
        role="worker",
        kernel=kernel,
        kernel_spec=info["kernel"],
        plans={},
        matrix_sources=info["matrix_sources"],
        wanted=list(info["wanted"]),
        done=set(info["done"]),
        device_spec=kind,
        device=torch.device(where.device),
        device_count=count,
        timeout_s=info["timeout_s"],
    )
    try:
        for source in state.matrix_sources:
            state.plan_for(source)
    except ConvmatrixError as exc:
        raise pytest.UsageError(str(exc)) from exc
    return state


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand each worker what it must not look up itself."""
    state = node.config.stash.get(STATE, None)
    if state is None:
        return
    node.workerinput[_WORKERINPUT] = {
        "kernel": state.kernel_spec,
        "matrix_sources": state.matrix_sources,
        "wanted": state.wanted,
        "done": sorted(state.done),
        "device_kind": state.device.type,
        "device_count": state.device_count,
        "timeout_s": state.timeout_s,
    }


def _install_sigterm() -> None:
    """SIGTERM (a CI job killed) ends the session like Ctrl-C: results flushed, run
    marked interrupted."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, handler)


# -- collection ---------------------------------------------------------------------------------
def pytest_collect_file(file_path: Any, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE, None)
    if state is not None and file_path.name.endswith(".matrix.yaml"):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class _CaseSource:
    """Yields one ``CaseItem`` per selected case of one plan."""

    source: str

    def _items(self: Any) -> list[CaseItem]:
        state: RunnerState = self.config.stash[STATE]
        plan = state.plan_for(self.source)
        return [
            CaseItem.from_parent(self, name=case.pytest_id, case=case, plan=plan)
            for case in plan.cases
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
    state = config.stash.get(STATE, None)
    if state is None:
        return
    for source in state.matrix_sources:
        plan = state.plan_for(source)
        collector = MatrixCollector.from_parent(session, name=plan.name, nodeid=plan.name)
        collector.source = source
        items.extend(session.genitems(collector))
    keep, drop = [], []
    for item in items:
        (keep if not isinstance(item, CaseItem) or state.selects(item.case) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# -- running ------------------------------------------------------------------------------------
class CaseFailed(Exception):
    """A judged case that did not pass; its message is the verdict builder's text."""


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, plan: Plan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.plan = plan

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.plan.name}: {self.case.pytest_id}"

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
        state: RunnerState = self.config.stash[STATE]
        if state.recorder is not None:  # single process: nothing will run after us
            state.recorder.finish(state.planned, interrupted=True)
            run = state.recorder.run_id
            hint = f"; convmatrix run --resume {run} runs the rest" if run is not None else ""
            capture = self.config.pluginmanager.getplugin("capturemanager")
            if capture is not None:  # the test's output capture holds stdout/stderr now
                capture.suspend_global_capture()
            terminal = self.config.pluginmanager.getplugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(f"\nconvmatrix: {result.message} ({self.case.pytest_id}){hint}")
                terminal.flush()

    def runtest(self) -> None:
        state: RunnerState = self.config.stash[STATE]
        limit = state.timeout_s or self.plan.timeout_s

        def on_timeout() -> None:
            after = "worker restarted" if state.role == "worker" else "the run stopped here"
            message = f"no result after {limit:g} s (the per-case limit); {after}"
            result = CaseResult(self.case, "timeout", limit, message, worker=self._worker())
            self._deliver(result, "\n".join(describe(result)))

        with Watchdog(limit, on_timeout):
            try:
                result = run_case(self.case, state.context(self.plan))
            except Exception as exc:  # a harness bug: recorded as error, the run goes on
                tail = "".join(traceback.format_exception(exc, limit=-4))
                result = CaseResult(self.case, "error", message=f"harness error: {tail}")
        result.worker = self._worker()
        self.user_properties.append((PAYLOAD, json.dumps(result.to_json())))
        if result.outcome == "skipped":
            pytest.skip(result.message or "skipped")
        if result.outcome != "passed":
            raise CaseFailed("\n".join(describe(result)))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> Any:
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)
