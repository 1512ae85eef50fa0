"""The ``ray`` executor: a run's cases on device actors of a Ray cluster, one driver recording.

``convmatrix run --executor ray [--address ADDR]`` (``pip install 'convmatrix[ray]'``):

- **Devices are resources.** Each node declares how many devices it offers as a custom
  resource named after the kind: ``cuda``, ``mlu`` (Ray has no native MLU support) or
  ``cpu_slot`` on CPU-only nodes (``ray start ... --resources '{"cuda": 8}'``). The driver
  starts one long-lived actor per unit, each requesting one unit; actors of a node are
  numbered there and bind to their physical device with the visibility variables, as xdist
  workers do (``runners.run.placement``).
- **One implementation of a case.** An actor runs its cases in a child process
  (``runners.executors.isolated``) through ``execute.run_guarded``, the function the xdist items
  call; results come back as the same ``CaseResult`` JSON and the driver, the only database writer,
  records them through the same ``Controller``. Each result carries its host and device index.
- **Kernel failures vs infrastructure failures.** Ray's own retries are off (actors are
  created with ``max_restarts=0``, calls with ``max_task_retries=0``): Ray would re-run a case
  whose process died on other devices. A kernel that kills its process kills only the child:
  that is a ``crashed`` result, which the driver confirms once on another device (if the
  cluster has one) and then records as ``crashed`` whatever the second attempt did not
  disprove; it is never retried again. A case whose actor or node is lost is resubmitted on
  another device, up to ``MAX_RETRIES`` times, each resubmission recorded (``retries``,
  ``retry_reason``); beyond that it is recorded as ``lost`` (an infrastructure outcome, not
the kernel's) with the reason ``lost node``.
  When no device is left the run stops ``interrupted`` and ``--resume RUN`` completes it.
- **The cluster itself failing is infrastructure** (exit 3, one line). ``--address`` is
  probed first with a TCP connection of ``CONNECT_TIMEOUT_S``: ``ray.init`` waits minutes
  for a GCS that is not there (its C++ client retries; no Python signal reaches it), so a
  closed port or a host that does not answer ends here within seconds. The run is recorded
  before any actor is asked for anything: an actor on a node that died but is still listed
  (``ActorDiedError`` while actors start) ends the run ``interrupted``, recorded, and
  ``--resume`` completes it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.errors import InfrastructureError, UsageError
from convmatrix.core.records import CaseResult
from convmatrix.runners.executors.isolated import ChildSpec, IsolatedRunner
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.account import RunAccount
from convmatrix.runners.run.controller import Controller, Setup
from convmatrix.runners.run.order import largest_first
from convmatrix.runners.run.placement import place_device
from convmatrix.runners.run.threads import ThreadSetting

__all__ = ["MAX_RETRIES", "RESOURCES", "DeviceWorker", "RayExecutor", "import_ray"]

MAX_RETRIES = 2  # resubmissions of a case after lost actors or nodes; then "lost node"
RESOURCES = {"cuda": "cuda", "mlu": "mlu", "cpu": "cpu_slot"}  # device kind -> resource
LOST = "lost node"  # the reason of an exhausted case (outcome ``lost``; see the report)
# Ray nices its workers (15) so that its daemons stay responsive; here the workers are the
# job, and a niced case starves behind anything else on the host (docs/deploy.md).
UNNICED = {"worker_niceness": 0}  # the _system_config of a cluster the executor starts
UNAVAILABLE = "unavailable: ray is not installed (pip install 'convmatrix[ray]')"
CONNECT_TIMEOUT_S = 10.0  # the TCP probe of --address; a cluster answers in milliseconds
ACTORS_START_S = 300.0  # actors placed and bound; beyond, a node is taken for gone


def import_ray() -> Any:
    """Ray, or ``UsageError`` (exit 2) saying how to get it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray: {UNAVAILABLE}") from None
    return ray


class DeviceWorker:
    """The body of a device actor (made a Ray actor by the executor): where it is, then pinned to
    one device, then running batches of cases in its child process."""

    def __init__(self, handover: dict[str, Any]) -> None:
        self.handover = handover
        self.runner: IsolatedRunner | None = None
        self.host = socket.gethostname()
        self.index: int | None = None
        self.name = ""

    def where(self) -> tuple[str, str, int]:
        """(node id, host name, niceness) of this actor."""
        import ray

        return (
            ray.get_runtime_context().get_node_id(),
            self.host,
            os.getpriority(os.PRIO_PROCESS, 0),
        )

    def bind(self, index: int, sharing: int, name: str) -> None:
        """Own device ``index`` of this node (``sharing`` actors on this host)."""
        from convmatrix.core.devices import cpu_cores

        kind = self.handover["device_kind"]
        policy = ThreadSetting(**self.handover["threads"])
        where = place_device(index, sharing, kind, cpu_cores(), policy=policy)
        os.environ.update(where.env)  # the child inherits the binding
        self.index, self.name = index, name
        spec = ChildSpec(self.handover, where.device, index, where.threads)
        self.runner = IsolatedRunner(spec)

    def run(self, batch: list[tuple[str, dict[str, Any], float | None]]) -> list[dict[str, Any]]:
        """Each (source, case JSON, time limit) of ``batch`` run in the child: result JSONs."""
        assert self.runner is not None, "bind the actor first"
        out = []
        for source, case_json, limit in batch:
            result = self.runner.run(source, Case.from_json(case_json), limit)
            result.host, result.device_index, result.worker = self.host, self.index, self.name
            out.append(result.to_json())
        return out

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


@dataclass
class _Task:
    """One case on its way: its source, the attempts so far and why they were repeated."""

    source: str
    case: Case
    limit: float | None
    retries: int = 0
    reasons: list[str] = field(default_factory=list)
    avoid: str | None = None  # the actor a crash is to be confirmed away from
    first_crash: CaseResult | None = None


@dataclass
class _Actor:
    handle: Any
    name: str
    node: str


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    ex = ray.exceptions
    return (ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError)


class RayExecutor:
    """``address``: a running cluster (``ray start --head ...``); None starts a local one
    with one ``cpu_slot`` per worker (``-n``). ``batch``: cases per actor call."""

    def __init__(
        self, address: str | None = None, batch: int = 1, verbose: int = 0, **_: Any
    ) -> None:
        self.address = address
        self.batch = max(1, batch)
        self.verbose = verbose

    def run(self, setup: Setup) -> RunAccount:
        ray = import_ray()
        request = setup.request
        resource = RESOURCES[setup.prepared.device.type]
        try:
            started = self._connect(ray, request, resource)
        except (ConnectionError, ray.exceptions.RayError) as err:  # no cluster to run on
            raise InfrastructureError(f"--executor ray: cannot reach the cluster: {err}") from err
        actors: list[_Actor] = []
        driver: _Driver | None = None
        controller: Controller | None = None
        try:
            units = _units(ray, resource)
            setup.request = replace(request, workers=units)  # the run's capacity, recorded
            controller = setup.controller()  # the run recorded before any actor is needed
            actors = self._actors(ray, setup, resource, units)
            print(f"convmatrix: {len(controller.planned)} cases on {len(actors)} device actors")
            driver = _Driver(ray, setup, controller, actors, self.batch)
            account = controller.finish(driver.drive())
        except KeyboardInterrupt:
            if controller is None:
                raise
            account = controller.finish(True, signalled=True)
        except (ConnectionError, ray.exceptions.RayError) as err:  # the cluster itself failed
            lost = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            again = ""
            if controller is not None:
                account = controller.finish(True)
                again = f" (run {account.run_id}: --resume runs the rest)"
            raise InfrastructureError(
                f"the Ray cluster failed under the run{again}: {type(err).__name__}: {lost}"
            ) from err
        finally:
            if controller is not None:
                controller.finish(True)  # an exception: keep what was recorded, say so
            alive = [a for a in actors if driver is None or a.name in driver.alive]
            _close(ray, alive)
            if started:
                ray.shutdown()
        for line in account.lines():
            print(line)
        return account

    def _connect(self, ray: Any, request: RunOptions, resource: str) -> bool:
        """Connect to the cluster (or start a local one); True when this process started it."""
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": self.verbose > 0}
        options["configure_logging"] = False
        if ray.is_initialized():
            return False
        if self.address:
            _reachable(self.address, CONNECT_TIMEOUT_S)
            ray.init(address=self.address, **options)
        else:
            from convmatrix.core.devices import cpu_cores, discover

            units = int(request.workers) or (
                cpu_cores() if resource == "cpu_slot" else discover(resource).count
            )
            ray.init(resources={resource: max(1, units)}, _system_config=UNNICED, **options)
        return True

    @staticmethod
    def _actors(ray: Any, setup: Setup, resource: str, units: int) -> list[_Actor]:
        """One actor per unit of ``resource`` in the cluster, numbered per node and bound."""
        remote = ray.remote(DeviceWorker).options(
            resources={resource: 1}, num_cpus=0, max_restarts=0, max_task_retries=0
        )
        handover = setup.prepared.handover()
        handles = [remote.remote(handover) for _ in range(units)]
        places = ray.get([h.where.remote() for h in handles], timeout=ACTORS_START_S)
        per_node: Counter[str] = Counter()
        per_host = Counter(host for _, host, _ in places)
        _warn_if_niced(sorted({host for _, host, nice in places if nice > 0}))
        actors = []
        binds = []
        for handle, (node, host, _) in zip(handles, places, strict=True):
            index = per_node[node]
            per_node[node] += 1
            name = f"ray:{node[:8]}:{index}"  # node and device; the host has its own column
            binds.append(handle.bind.remote(index, per_host[host], name))
            actors.append(_Actor(handle, name, node))
        ray.get(binds, timeout=ACTORS_START_S)
        return actors


def _units(ray: Any, resource: str) -> int:
    """The units of ``resource`` the cluster declares (a device actor each)."""
    units = int(ray.cluster_resources().get(resource, 0))
    if units < 1:
        raise UsageError(
            f"--executor ray: no node of the cluster declares the resource {resource!r}; "
            f"start nodes with --resources '{{\"{resource}\": N}}' (docs/deploy.md)"
        )
    return units


def _reachable(address: str, timeout_s: float) -> None:
    """``InfrastructureError`` unless something accepts a TCP connection at ``address``
    (``HOST:PORT``, ``ray://HOST:PORT``) within ``timeout_s``; ``auto`` is Ray's to find."""
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout_s):
            pass
    except OSError as err:
        raise InfrastructureError(
            f"--executor ray --address {address}: nothing answers there within "
            f"{timeout_s:g} s ({err.strerror or err}); start the cluster (ray start --head) "
            "or give the head node's address"
        ) from None


def _warn_if_niced(hosts: list[str]) -> None:
    if hosts:
        print(f"convmatrix: warning: device actors on {', '.join(hosts)} run niced (Ray's "
              "default for workers): other load on those hosts slows their cases and can trip "
              "time limits; start the nodes with RAY_worker_niceness=0 (docs/deploy.md)",
              file=sys.stderr)  # fmt: skip


def _close(ray: Any, actors: list[_Actor]) -> None:
    """Let live actors stop their case processes, then end them (a lost one is gone)."""
    # An actor lost meanwhile, or stuck, raises here: it is killed below either way.
    with contextlib.suppress(Exception):
        ray.get([a.handle.close.remote() for a in actors], timeout=30)
    for actor in actors:
        ray.kill(actor.handle, no_restart=True)


class _Driver:
    """The dispatch loop: tasks to idle actors, results to the controller, losses retried."""

    def __init__(
        self, ray: Any, setup: Setup, controller: Controller, actors: list[_Actor], batch: int
    ):
        self.ray = ray
        self.controller = controller
        self.idle = list(actors)
        self.alive = {a.name for a in actors}
        self.batch = batch
        self.in_flight: dict[Any, tuple[_Actor, list[_Task]]] = {}
        self.queue: deque[_Task] = deque()
        prepared = setup.prepared
        tasks = []
        for source in prepared.sources:
            workload = prepared.workload(source)
            limit = prepared.timeout_s or workload.timeout_s
            for case in workload.cases:
                if case.id in controller.planned and case.id not in controller.results:
                    tasks.append(_Task(source, case, limit))
        self.queue.extend(largest_first(tasks, lambda task: task.case))  # runners.run.order

    def drive(self) -> bool:
        """Run every task; True when the run stopped short (no device left)."""
        lost = _lost_errors(self.ray)
        while self.queue or self.in_flight:
            self._dispatch()
            if not self.in_flight:
                if self.queue:
                    print(
                        f"convmatrix: every device actor is lost; {len(self.queue)} cases not "
                        "run (convmatrix run --resume RUN runs them when nodes are back)",
                        file=sys.stderr,
                    )
                return bool(self.queue)
            ready, _ = self.ray.wait(list(self.in_flight), num_returns=1)
            actor, tasks = self.in_flight.pop(ready[0])
            try:
                results = self.ray.get(ready[0])
            except lost as exc:
                self._actor_lost(actor, tasks, exc)
                continue
            self.idle.append(actor)
            for task, data in zip(tasks, results, strict=True):
                self._result(task, actor, CaseResult.from_json(data))
        return False

    def _dispatch(self) -> None:
        while self.idle and self.queue:
            actor = self.idle.pop(0)
            batch = self._take(actor)
            if not batch:  # only crash confirmations meant for another actor are left
                self.idle.append(actor)
                return
            items = [(t.source, t.case.to_json(), t.limit) for t in batch]
            self.in_flight[actor.handle.run.remote(items)] = (actor, batch)

    def _take(self, actor: _Actor) -> list[_Task]:
        """Up to ``batch`` tasks for ``actor`` (not a crash to confirm away from it)."""
        taken: list[_Task] = []
        for task in list(self.queue):
            if len(taken) == self.batch:
                break
            if task.avoid == actor.name and len(self.alive) > 1:
                continue
            self.queue.remove(task)
            taken.append(task)
        return taken

    def _actor_lost(self, actor: _Actor, tasks: list[_Task], exc: BaseException) -> None:
        """An actor (its process or its node) is gone: its cases go to other devices."""
        self.alive.discard(actor.name)
        why = f"actor {actor.name} lost ({type(exc).__name__})"
        for task in tasks:
            task.reasons.append(why)
            if task.retries >= MAX_RETRIES:
                message = f"{LOST}: no result after {task.retries + 1} attempts ({why})"
                self._record(task, CaseResult(task.case, "lost", message=message))
            else:
                task.retries += 1
                self.queue.appendleft(task)

    def _result(self, task: _Task, actor: _Actor, result: CaseResult) -> None:
        if result.outcome == "crashed" and task.first_crash is None and len(self.alive) > 1:
            # Confirm a crash once on another device before blaming the kernel.
            task.first_crash, task.avoid = result, actor.name
            task.retries += 1
            task.reasons.append(f"crashed on {actor.name}; confirming on another device")
            self.queue.appendleft(task)
            return
        if task.first_crash is not None and result.outcome != "crashed":
            result.message = (
                f"{result.message or ''} (crashed once on {task.avoid}: {task.first_crash.message})"
            ).strip()
        self._record(task, result)

    def _record(self, task: _Task, result: CaseResult) -> None:
        result.retries, result.retry_reason = task.retries, "; ".join(task.reasons) or None
        self.controller.record(result)
