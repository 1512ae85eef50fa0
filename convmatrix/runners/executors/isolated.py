"""Cases run in a child process of their device's worker, so a kernel that kills its process
kills only the child.

The Ray executor's device actor is long-lived and must survive the kernels it runs: an actor
that died with its case would look, to the driver, exactly like a lost node, and Ray would
route the next attempt to another device. So the actor keeps one child process (spawned, with
the actor's device binding inherited through the environment) that loads the kernel and the
workloads once and runs cases it is sent over a pipe. The child's death while it runs a case
is that case's ``crashed`` result; a case over its time limit is killed and is its
``timeout`` result; either way the next case gets a fresh child. xdist reaches the same
results with its own machinery (a dead worker is replaced; ``runners.executors.xdist.watchdog``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.ending import end_process
from convmatrix.core.records import CaseResult

__all__ = ["ChildSpec", "IsolatedRunner"]

START_LIMIT_S = 600.0  # a child that cannot load the kernel in this long is broken


@dataclass(frozen=True)
class ChildSpec:
    """What the child rebuilds the run from: the controller's handover, the device string it
    is pinned to (visibility variables are already in the environment), its physical index and
    its torch threads."""

    handover: dict[str, Any]
    device: str
    device_index: int | None
    threads: int | None


def _child(conn: Connection, spec: ChildSpec) -> None:
    """The child's loop: (source, case JSON) in, ``CaseResult`` JSON out, until None."""
    import torch

    from convmatrix.core.devices import backend_module
    from convmatrix.runners.case.execute import run_guarded
    from convmatrix.runners.run.controller import Prepared

    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    else:
        backend_module(spec.handover["device_kind"])
    prepared = Prepared.rebuild(spec.handover, torch.device(spec.device), spec.device_index)
    conn.send("ready")
    while (message := conn.recv()) is not None:
        source, case_json = message
        case = Case.from_json(case_json)
        workload = prepared.workload(source)
        result = run_guarded(case, prepared.context(workload))
        conn.send(result.to_json())
    end_process(0, ran_kernel=True)  # as an xdist worker ends: no teardown, no kernel hooks


class IsolatedRunner:
    """One child process at a time; ``run`` gives every case its result, whatever it does."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a threaded actor
        self._process: Any = None
        self._conn: Connection | None = None
        self.started = 0  # children started (1 + crashes + timeouts)

    def _start(self) -> Connection:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_child, args=(child, self.spec), daemon=True)
        self._process.start()
        child.close()
        self.started += 1
        if not parent.poll(START_LIMIT_S) or parent.recv() != "ready":
            self.close()
            raise RuntimeError("the case runner process did not start")
        self._conn = parent
        return parent

    def run(self, source: str, case: Case, timeout_s: float | None) -> CaseResult:
        """Run ``case`` (of workload ``source``) in the child: its own result, or ``crashed``
        when the child died running it, or ``timeout`` after ``timeout_s``."""
        start = time.perf_counter()
        conn = self._conn or self._start()
        try:
            conn.send((source, case.to_json()))
            if conn.poll(timeout_s if timeout_s and timeout_s > 0 else None):
                return CaseResult.from_json(conn.recv())
        except (EOFError, OSError, BrokenPipeError):
            why = self._death()
            message = f"the case process died while running this case ({why})"
            return CaseResult(case, "crashed", time.perf_counter() - start, message)
        self.kill()
        message = f"no result after {timeout_s:g} s (the per-case limit); case process killed"
        return CaseResult(case, "timeout", time.perf_counter() - start, message)

    def _death(self) -> str:
        process = self._process
        if process is not None:
            process.join(5)
        code = None if process is None else process.exitcode
        self._forget()
        if code is not None and code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._process = None, None

    def kill(self) -> None:
        """End the child now (a hung case); the next case starts a fresh one."""
        process = self._process
        if process is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join(5)
        self._forget()

    def close(self) -> None:
        """Ask the child to stop, then make sure it has."""
        if self._conn is not None and self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()
