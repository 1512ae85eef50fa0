"""The controller's part of the plugin: setting a run up, recording reports, closing the run.

Imported only in the process that owns the session (the xdist controller or a plain pytest
process), never in workers: this is where the database layer comes in. ``controller_state``
resolves the kernel, the matrices, ``--resume`` and the device kind before any worker starts;
``Controller`` is registered as a plugin object and turns reports into recorded results.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any

import pytest
import torch

import convmatrix
from convmatrix.db import RunMeta, Session, done_case_ids, open_database
from convmatrix.errors import UsageError
from convmatrix.matrix.case import Case
from convmatrix.runners.devices import discover, resolve_device
from convmatrix.runners.plan import combined_identity, select_cases
from convmatrix.runners.plugin import PAYLOAD, RunnerState, _load_kernel
from convmatrix.runners.recorder import Recorder, kernel_provenance, open_resumed
from convmatrix.runners.results import CaseResult
from convmatrix.runners.summary import summary_lines

__all__ = ["Controller", "controller_state"]


def _file_sources(config: pytest.Config) -> list[str]:
    """``*.matrix.yaml`` files named on the command line, as absolute paths."""
    found = []
    for arg in config.args:
        path = str(arg).split("::")[0]
        if path.endswith(".matrix.yaml"):
            found.append(str((config.invocation_params.dir / path).resolve()))
    return found


def _device(spec: str, xdist: bool) -> tuple[torch.device, int]:
    """(device, how many of its kind workers are spread over)."""
    device = resolve_device(spec)
    if not xdist or device.type == "cpu":
        return device, 1
    if ":" in spec:
        raise UsageError(f"--device {spec}: with -n give a kind (cuda, mlu); workers spread")
    return torch.device(device.type), discover(device.type).count


def _meta(config: pytest.Config, state: RunnerState, xdist: bool) -> RunMeta:
    plans = [state.plans[s] for s in state.plans]
    name, digest = combined_identity(plans)
    backend = discover(state.device.type)
    commit, dirty = config.getoption("commit"), None
    if not commit:
        commit, dirty = kernel_provenance(state.kernel)
    describe = getattr(state.kernel, "describe", None)
    versions = {**backend.versions, "convmatrix": convmatrix.__version__}
    versions["python"] = platform.python_version()
    return RunMeta(
        kernel=state.kernel.name,
        matrix=name,
        matrix_hash=digest,
        device_kind=state.device.type,
        device_name=backend.devices[0].name if backend.devices else None,
        kernel_commit=commit,
        kernel_dirty=dirty,
        versions=versions,
        label=config.getoption("label"),
        argv=list(sys.argv),
        options={
            "kernel_spec": state.kernel_spec,
            "matrix_sources": list(state.plans),
            "workers": getattr(config.option, "numprocesses", None) if xdist else 0,
            "device": state.device_spec,
            "case_timeout_s": state.timeout_s,
            "cases": state.wanted,
        },
        geometry=dict(describe().get("geometry", {})) if callable(describe) else None,
        n_planned=len(state.planned),
    )


def controller_state(config: pytest.Config, xdist: bool) -> RunnerState:
    """Everything the session needs, resolved once here and handed to workers."""
    opt = config.getoption
    url, resume = opt("db"), None
    sources = [opt("matrix")] if opt("matrix") else []
    kernel_spec = opt("kernel")
    if opt("resume"):
        if opt("no_db"):
            raise UsageError("--resume needs the database; drop --no-db")
        resume = open_resumed(url, opt("resume"))
        stored = list(resume.options.get("matrix_sources") or [resume.matrix])
        if sources and sources != stored[:1] and not set(sources) <= set(stored):
            raise UsageError(f"--resume {resume.id}: the run used --matrix {stored}, not {sources}")
        sources = stored
        kernel_spec = kernel_spec or resume.options.get("kernel_spec") or resume.kernel
    kernel = _load_kernel(kernel_spec)
    files = _file_sources(config)
    device, count = _device(opt("device"), xdist)
    state = RunnerState(
        role="controller" if xdist else "single",
        kernel=kernel,
        kernel_spec=str(kernel_spec),
        plans={},
        matrix_sources=[s for s in sources if s not in files],
        wanted=list(opt("cm_cases")),
        done=set(),
        device_spec=opt("device"),
        device=device,
        device_count=count,
        timeout_s=opt("case_timeout"),
    )
    known = [c for s in sources + files for c in state.plan_for(s).cases]
    if resume is not None:
        engine = open_database(url)
        with Session(engine) as session:
            state.done = done_case_ids(session, resume.id)
        engine.dispose()
    state.planned = {c.id for c in select_cases(known, state.wanted, state.done)}
    meta = _meta(config, state, xdist)
    state.recorder = Recorder(
        url, meta, resume=None if resume is None else resume.id, enabled=not opt("no_db")
    )
    config.pluginmanager.register(Controller(config, state), "convmatrix-controller")
    return state


class Controller:
    """Hooks of the process that records: reports in, results out to the database."""

    def __init__(self, config: pytest.Config, state: RunnerState) -> None:
        self.config = config
        self.state = state

    def _case_of(self, nodeid: str) -> Case | None:
        """The case behind a node id (crash reports carry nothing else)."""
        pytest_id = nodeid.rsplit("::", 1)[-1].split("@")[0]
        if pytest_id not in self.state.by_pytest_id:
            path = nodeid.split("::")[0]
            if path.endswith(".matrix.yaml"):
                self.state.plan_for(str((self.config.rootpath / path).resolve()))
        return self.state.by_pytest_id.get(pytest_id)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        recorder = self.state.recorder
        payload = dict(report.user_properties).get(PAYLOAD)
        if payload and report.when == "call":
            recorder.record(CaseResult.from_json(json.loads(payload)))
            return
        case = self._case_of(report.nodeid)
        if case is None:
            return
        if report.when == "???":  # xdist: the worker died while running this item
            node = getattr(report, "node", None)
            worker = getattr(getattr(node, "gateway", None), "id", None)
            recorder.crashed(case, worker, str(report.longrepr))
        elif report.failed and report.when in ("setup", "teardown"):
            text = f"{report.when} failed: {report.longreprtext[-2000:]}"
            recorder.record(CaseResult(case=case, outcome="error", message=text))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        case = self._case_of(crashitem)
        held = None if case is None else self.state.recorder.tally.results.get(case.id)
        if held is not None:
            report.longrepr = f"{report.longrepr} after recording it as {held.outcome}"

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
        self.state.interrupted = interrupted
        self.state.recorder.finish(self.state.planned, interrupted)

    def summary(self) -> list[str]:
        recorder = self.state.recorder
        info = recorder.run_info()
        where = None
        if info is not None:
            from convmatrix.db import redact_url

            where = redact_url(recorder.writer.engine.url)
        return summary_lines(
            recorder.tally.results.values(),
            run_id=recorder.run_id,
            status=recorder.status,
            run_counts=None if info is None else info.counts,
            where=where,
            crashed_workers=sum(recorder.tally.crashed_workers.values()),
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("=", "convmatrix")
        for line in self.summary():
            terminalreporter.write_line(line)
