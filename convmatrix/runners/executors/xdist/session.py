"""The controller's part of the pytest plugin: setting a run up, recording reports, closing it.

Runs in the process that owns the session (the xdist controller, or a plain pytest process),
never in workers. ``start_controller`` takes the run prepared by the caller of pytest
(``pytest_convmatrix_setup``) or prepares it from the options with the store some plugin
offers (``pytest_convmatrix_store``), opens the run and registers ``ControllerPlugin``, which
turns reports into recorded results and, at the end, announces the ``RunAccount``
(``pytest_convmatrix_finished``) and prints it.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.core.devices import cpu_cores
from convmatrix.core.errors import NotJudgedError, machine_fault
from convmatrix.core.records import CaseResult
from convmatrix.runners.case.interrupts import note_taken
from convmatrix.runners.executors.xdist.watchdog import witness
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import Controller, Prepared, Setup
from convmatrix.runners.run.store import MemoryStore
from convmatrix.runners.run.threads import export, use

__all__ = [
    "IN_PROCESS",
    "PAYLOAD",
    "ControllerPlugin",
    "start_controller",
    "stop_after_timeout",
]

PAYLOAD = "convmatrix_result"  # the report's user_properties key of the JSON CaseResult
# Where a process that runs its cases and records them itself (-n 0) leaves each result for
# its own recorder, by node id: reading back the JSON it just wrote cost 0.08 ms a case.
IN_PROCESS = pytest.StashKey[dict[str, CaseResult]]()
_NAME = "convmatrix-controller"


def _file_sources(config: pytest.Config) -> list[str]:
    """``*.matrix.yaml`` files named on the command line, as absolute paths."""
    found = []
    for arg in config.args:
        path = str(arg).split("::")[0]
        if path.endswith(".matrix.yaml"):
            found.append(str((config.invocation_params.dir / path).resolve()))
    return found


def _options(config: pytest.Config, xdist: bool) -> RunOptions:
    """The run a plain ``pytest --matrix ...`` asks for, checked like every other door's."""
    workers = int(getattr(config.option, "numprocesses", 0) or 0) if xdist else 0
    files = tuple(_file_sources(config))
    return RunOptions.from_pytest(config, workers=workers, files=files).checked()


def start_controller(config: pytest.Config, setup: Setup | None, xdist: bool) -> Prepared:
    """Prepare the run (unless the caller did: ``setup``), apply its thread policy (to this
    process when it runs the cases), open it in its store, and register the recording hooks."""
    if setup is None:
        store = config.hook.pytest_convmatrix_store(config=config) or MemoryStore()
        setup = Setup.of(_options(config, xdist), store)
    # Under xdist's worksteal the workers (handed this) collect the cases largest first.
    setup.prepared.largest_first = xdist and getattr(config.option, "dist", "") == "worksteal"
    policy = setup.prepared.threads
    if xdist or setup.prepared.device.type != "cpu":
        export(policy)  # the workers xdist starts next inherit the wait
    else:  # -n 0 on the CPU: this process runs the cases; a caller's own count comes back
        config.add_cleanup(partial(torch.set_num_threads, torch.get_num_threads()))
        use(policy, 0, cpu_cores())
    if not xdist:  # the cases run here: their results reach the recorder as they are
        config.stash[IN_PROCESS] = {}
    controller = setup.controller()
    config.pluginmanager.register(ControllerPlugin(config, setup.prepared, controller), _NAME)
    seen = witness()
    if seen is not None:
        seen.run(controller.run_id)
    return setup.prepared


def stop_after_timeout(config: pytest.Config, why: str) -> None:
    """A single-process run whose case hung: close the run now (the process ends next) and
    say how to finish it."""
    plugin: ControllerPlugin = config.pluginmanager.get_plugin(_NAME)
    account = plugin.controller.finish(interrupted=True)
    seen = witness()
    if seen is not None:  # the process ends next, in order: its line is the one below
        seen.done()
    hint = (
        ""
        if account.run_id is None
        else f"; convmatrix run --resume {account.run_id} runs the rest"
    )
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # the test's output capture holds stdout/stderr now
        capture.suspend_global_capture()
    terminal = config.pluginmanager.getplugin("terminalreporter")
    if terminal is not None:
        terminal.write_line(f"\nconvmatrix: {why}{hint}")
        terminal.flush()


class ControllerPlugin:
    """Hooks of the process that records: reports in, results out to the store."""

    def __init__(self, config: pytest.Config, prepared: Prepared, controller: Controller) -> None:
        self.config = config
        self.prepared = prepared
        self.controller = controller

    def _case_of(self, nodeid: str) -> Case | None:
        """The case behind a node id (crash reports carry nothing else)."""
        pytest_id = nodeid.rsplit("::", 1)[-1].split("@")[0]
        if pytest_id not in self.prepared.by_pytest_id:
            path = nodeid.split("::")[0]
            if path.endswith(".matrix.yaml"):
                self.prepared.workload(str((self.config.rootpath / path).resolve()))
        return self.prepared.by_pytest_id.get(pytest_id)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            local = self.config.stash.get(IN_PROCESS, None)
            result = local.pop(report.nodeid, None) if local else None
            if result is not None:  # run in this process: the object its JSON was made of
                self.controller.record(result)
                return
            payload = dict(report.user_properties).get(PAYLOAD)
            if payload:
                self.controller.record(CaseResult.from_json(json.loads(payload)))
                return
        case = self._case_of(report.nodeid)
        if case is None:
            return
        if report.when == "???":  # xdist: the worker died while running this item
            node = getattr(report, "node", None)
            worker = getattr(getattr(node, "gateway", None), "id", None)
            self.controller.crashed(case, worker, str(report.longrepr))
        elif report.failed and report.when in ("setup", "teardown", "call"):
            # a call that failed without a result raised outside the case's guard: the harness
            text = f"{report.when} failed: {report.longreprtext[-2000:]}"
            self.controller.record(CaseResult(case=case, outcome="error", message=text))
            fault = machine_fault(report.longreprtext)
            if fault is not None:  # not the kernel's: the run ends with exit 3
                self.controller.infrastructure = fault

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        case = self._case_of(crashitem)
        held = None if case is None else self.controller.results.get(case.id)
        if held is not None:
            report.longrepr = f"{report.longrepr} after recording it as {held.outcome}"

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        note_taken()  # the run is closed next (pytest_sessionfinish): stop raising it again

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        signalled = exitstatus == pytest.ExitCode.INTERRUPTED
        account = self.controller.finish(signalled or bool(session.shouldstop), signalled)
        self.config.hook.pytest_convmatrix_finished(config=self.config, account=account)
        if exitstatus == pytest.ExitCode.OK and account.exit_code == NotJudgedError.exit_code:
            # Every case skipped is green to pytest; ``pytest --matrix`` in a CI job must not
            # pass on it: the session ends with convmatrix's "nothing judged" status.
            session.exitstatus = NotJudgedError.exit_code

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        account = self.controller.account
        if account is None:
            return
        terminalreporter.write_sep("=", "convmatrix")
        for line in account.lines():
            terminalreporter.write_line(line)
