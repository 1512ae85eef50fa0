"""One run, executor-neutral: what every process of it agrees on, and the one place results land.

- ``RunOptions`` (``runners.options``): what a person asked for, checked.
- ``Prepared``: what the request resolves to (the kernel, the expanded workloads, the device,
  which cases this session runs). The controller prepares it once (``prepare``), with the
  store for ``--resume``; every worker rebuilds the same thing from the few values the
  controller hands it, so controller and workers agree on the cases.
- ``Controller``: the single recorder of a run (the xdist controller, the Ray driver): each
  case is recorded once (a timeout result beats the crash report that follows it), results go
  to the ``RunStore``, and ``finish`` closes the run into a ``RunAccount``.
"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from dataclasses import astuple, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from convmatrix.core import __version__
from convmatrix.core.case import Case
from convmatrix.core.devices import cpu_cores, discover, resolve_device
from convmatrix.core.errors import NotJudgedError, UsageError
from convmatrix.core.recorded import stored_options
from convmatrix.core.records import OUTCOMES, CaseResult, RunMeta, run_identity
from convmatrix.kernels.interface.registry import KernelLoadError, KernelSpecError, load
from convmatrix.runners.case.execute import Context
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.directory import cache_directory
from convmatrix.runners.case.refcache.footprint import admit
from convmatrix.runners.options import RunOptions, parse_size
from convmatrix.runners.run.account import (
    DEFAULT_MIN_JUDGED,
    RunAccount,
    skip_reasons,
    worst_failures,
)
from convmatrix.runners.run.progress import Progress
from convmatrix.runners.run.provenance import kernel_identity
from convmatrix.runners.run.store import RunStore, Shard, StoredRun
from convmatrix.runners.run.threads import ThreadSetting, decide
from convmatrix.runners.run.workload import Workload, combined_identity, load_workload, select_cases

__all__ = ["Controller", "Prepared", "Setup", "load_kernel", "prepare", "run_meta"]


def load_kernel(spec: str | None) -> Any:
    """The kernel a ``--kernel`` spec names; ``UsageError`` (exit 2) when it names none,
    ``NotJudgedError`` (exit 4) when it names one that could not be loaded."""
    if not spec:
        raise UsageError("--kernel is required (e.g. --kernel torch)")
    try:
        return load(spec)
    except KernelLoadError as exc:
        raise NotJudgedError(f"nothing judged: the kernel could not be loaded: {exc}") from exc
    except KernelSpecError as exc:
        raise UsageError(f"--kernel: {exc}") from exc


# Prepared's fields a worker makes itself (the kernel from ``kernel_spec``, the device it is
# pinned to) or fills as it runs; every other field is handed over by name.
_LOCAL = frozenset(
    {"kernel", "device", "device_index", "resume", "workloads", "by_pytest_id", "given", "_cache"}
)


def _plain(value: Any) -> Any:
    """A field's value as workerinput and Ray carry it (``Prepared.rebuild`` reads it back)."""
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, Shard):
        return astuple(value)
    if isinstance(value, ThreadSetting):
        return value.handover()
    return value


@dataclass
class Prepared:
    """A run resolved: the same on the controller and on every worker."""

    kernel: Any
    kernel_spec: str
    sources: list[str]  # matrix sources to collect (built-in names or absolute paths)
    wanted: list[str]  # --case values (empty: every case)
    done: set[str]  # ids a resumed run already holds
    device_spec: str
    device: torch.device
    device_count: int = 1  # devices of the kind workers spread over
    timeout_s: float | None = None  # --case-timeout overrides the matrix's
    resume: int | None = None  # the stored run this session completes
    rule: str | None = None  # --policy RULE overrides the rule of the matrix's policy
    shard: Shard | None = None  # only the cases this shard owns
    device_index: int | None = None  # the physical device this process is pinned to
    reference_device: str = "auto"  # --reference-device: auto | host | device
    reference_cache: str | None = None  # the cache directory (None: off)
    reference_cache_size: int = 0
    max_cases: int | None = None  # --max-cases: the case limit of every matrix
    threads: ThreadSetting = field(default_factory=ThreadSetting)  # of every process running cases
    largest_first: bool = False  # items handed out the largest first (runners.run.order)
    workloads: dict[str, Workload] = field(default_factory=dict)  # by source
    by_pytest_id: dict[str, Case] = field(default_factory=dict)
    given: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # planned, as JSON
    _cache: ReferenceCache | None = field(default=None, repr=False, compare=False)

    def workload(self, source: str) -> Workload:
        """The expanded matrix of ``source`` for this kernel (only the ``--case`` cases when
        some are named; on a worker, the cases its controller planned), loaded once."""
        if source not in self.workloads:
            self.workloads[source] = load_workload(
                source, self.kernel, self.max_cases, self.wanted, self.given.get(source)
            )
            self.by_pytest_id.update((c.pytest_id, c) for c in self.workloads[source].cases)
        return self.workloads[source]

    def selects(self, case: Case) -> bool:
        """Whether this session runs ``case`` (same answer on the controller and workers)."""
        if case.id in self.done or (self.shard is not None and not self.shard.owns(case.id)):
            return False
        return not self.wanted or bool(select_cases([case], self.wanted, strict=False))

    def context(self, workload: Workload) -> Context:
        policy = workload.policy
        if self.rule is not None:
            policy = replace(policy, rule=self.rule)
        return Context(
            self.kernel,
            workload.tolerances,
            policy,
            self.device,
            timing=workload.timing,
            memory_budget_mb=workload.memory_budget_mb,
            reference_device=reference_device(self.reference_device, self.device),
            reference_cache=self.cache(),
        )

    def cache(self) -> ReferenceCache | None:
        """The run's reference cache (None: off), admitting the largest of the whole run's
        planned cases that fit its limit (``refcache.footprint.admit``): the same on the
        controller, every worker and every shard. Decided once per process."""
        if not self.reference_cache:
            return None
        if self._cache is None:
            known = [c for w in self.workloads.values() for c in w.cases]
            caps = self.kernel.capabilities  # skipped and expected-error cases compute none
            planned = [
                c for c in select_cases(known, self.wanted, set())
                if c.expect != "error" and not caps.missing_features(c)
            ]  # fmt: skip
            limit = self.reference_cache_size
            self._cache = ReferenceCache(Path(self.reference_cache), limit, admit(planned, limit))
        return self._cache

    def handover(self) -> dict[str, Any]:
        """What a worker needs to rebuild this run (``rebuild``): plain values only, as
        xdist's workerinput and Ray's task arguments carry them. Every field but the
        worker's own (``_LOCAL``) goes, by its name: a field added here reaches the workers
        without a second list to keep in step."""
        info = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in _LOCAL}
        info["device_kind"] = self.device.type
        # --case: the few cases planned, so that no worker expands the matrix again
        info["planned"] = (
            {source: [c.to_json() for c in w.cases] for source, w in self.workloads.items()}
            if self.wanted
            else {}
        )
        return info

    @classmethod
    def rebuild(
        cls, info: dict[str, Any], device: torch.device, device_index: int | None
    ) -> Prepared:
        """The controller's ``Prepared`` in a worker pinned to ``device`` (``handover``)."""
        values = {f.name: info[f.name] for f in fields(cls) if f.name not in _LOCAL}
        values.update(
            wanted=list(values["wanted"]),
            done=set(values["done"]),
            shard=Shard(*values["shard"]) if values["shard"] else None,
            threads=ThreadSetting(**values["threads"]),
        )
        prepared = cls(
            kernel=load_kernel(info["kernel_spec"]),
            device=device,
            device_index=device_index,
            given=dict(info.get("planned") or {}),
            **values,
        )
        for source in prepared.sources:
            prepared.workload(source)
        return prepared

    def planned(self, whole_run: bool = False) -> set[str]:
        """Ids of the cases this session runs, over every workload loaded so far (the
        controller loads them all in ``prepare``); ``whole_run``: of every shard, done or not."""
        known = [c for w in self.workloads.values() for c in w.cases]
        if whole_run:
            return {c.id for c in select_cases(known, self.wanted, set())}
        if self.shard is not None:
            known = [c for c in known if self.shard.owns(c.id)]
        return {c.id for c in select_cases(known, self.wanted, self.done)}


def reference_device(spec: str, device: torch.device) -> torch.device | None:
    """Where the float64 reference runs (None: the host, the CPU). ``auto``: the case's
    device when it computes in float64 (CUDA does; MLUs have no float64), else the host."""
    if spec == "host" or device.type == "cpu":
        return None
    if device.type == "mlu":
        if spec == "device":
            raise UsageError("--reference-device device: an MLU has no float64; use host")
        return None
    return device


def _device(spec: str, spread: bool) -> tuple[torch.device, int]:
    """(device, how many of its kind workers are spread over)."""
    device = resolve_device(spec)
    if not spread or device.type == "cpu":
        return device, 1
    if ":" in spec:
        raise UsageError(f"--device {spec}: with -n give a kind (cuda, mlu); workers spread")
    return torch.device(device.type), discover(device.type).count


def prepare(request: RunOptions, store: RunStore) -> Prepared:
    """Resolve ``request`` (checked options) on the controller: the stored run it resumes (one
    lookup in the store), the kernel, the device, every workload. ``UsageError`` names what is
    wrong."""
    sources = [request.matrix] if request.matrix else []
    kernel_spec, resume, joined = request.kernel, None, None
    if request.sharding is not None:
        if request.resume:
            raise UsageError("--resume with --shard: rerun the shard with its --run-label")
        # A shard started again (its job retried by CI) runs only what it has not recorded,
        # of the same run: its identity is checked below, once the kernel and matrix are known.
        joined = store.sharded(request.sharding.label)
    elif request.resume:
        resume = store.lookup(request.resume)
        stored = list(resume.matrix_sources)
        if sources and sources != stored[:1] and not set(sources) <= set(stored):
            raise UsageError(f"--resume {resume.id}: the run used --matrix {stored}, not {sources}")
        sources = stored
        kernel_spec = kernel_spec or resume.kernel_spec or resume.kernel
    device, count = _device(request.device, int(request.workers) > 0)
    prepared = Prepared(
        kernel=load_kernel(kernel_spec),
        kernel_spec=str(kernel_spec),
        sources=[s for s in sources if s not in request.files],
        wanted=list(request.cases),
        done=set(resume.done) if resume else set(),
        device_spec=request.device,
        device=device,
        device_count=count,
        timeout_s=request.case_timeout,
        resume=resume.id if resume else None,
        rule=request.rule,
        shard=request.sharding,
        reference_device=request.reference_device,
        reference_cache=cache_directory(request.reference_cache),
        reference_cache_size=parse_size(request.reference_cache_size),
        max_cases=request.max_cases,
        threads=decide(request.threads),
    )
    for source in [*sources, *request.files]:
        prepared.workload(source)
    if joined is not None:
        _check_joined(joined, prepared, request)
        prepared.done = set(joined.done)
    return prepared


def _check_joined(joined: StoredRun, prepared: Prepared, request: RunOptions) -> None:
    """A shard joins the run of its label only if it is that run: the same kernel at the same
    commit, the same matrix and the same kind of device. Otherwise its cases would be mixed
    into another run's (a label reused at a new commit would even find every case done and
    pass, having run nothing)."""
    ours = run_identity(run_meta(prepared, request, 0))
    if joined.identity is not None and joined.identity != ours:
        assert request.sharding is not None
        raise UsageError(
            f"--run-label {request.sharding.label}: run {joined.id} is {joined.identity}; "
            f"this shard is {ours}: give each run its own label"
        )


@dataclass
class Setup:
    """A run ready to start: the request, what it resolved to, and where results go."""

    request: RunOptions
    prepared: Prepared
    store: RunStore

    @classmethod
    def of(cls, request: RunOptions, store: RunStore) -> Setup:
        """The run prepared, then the store checked: a refused run (a bad matrix, kernel or
        option) touches no database; a store it cannot write is refused before it starts."""
        prepared = prepare(request, store)
        store.check()
        return cls(request, prepared, store)

    def controller(self) -> Controller:
        """The run's recorder, with the run opened in the store."""
        planned = self.prepared.planned()
        # A shard records the whole run's count: the run is one, whichever shard creates it.
        whole = self.prepared.planned(whole_run=True) if self.request.sharding else planned
        meta = run_meta(self.prepared, self.request, len(whole))
        progress = Progress(len(planned))
        shard = self.request.sharding
        controller = Controller(self.store, meta, planned, self.prepared.resume, progress, shard)
        controller.min_judged = self.request.min_judged
        for workload in self.prepared.workloads.values():
            controller.known.update((c.id, c) for c in workload.cases if c.id in planned)
        return controller


def declared_arithmetic(kernel: Any) -> dict[str, Any]:
    """The kernel's declared arithmetic (``Capabilities``), as a run records it."""
    caps = kernel.capabilities
    return {
        "accumulate": caps.accumulate,
        "intermediate": caps.intermediate,
        "deterministic": bool(caps.deterministic),
    }


def run_meta(prepared: Prepared, request: RunOptions, planned: int) -> RunMeta:
    """What identifies the run in the store (kernel and its commit, matrix, device, versions)."""
    name, digest = combined_identity(list(prepared.workloads.values()))
    backend = discover(prepared.device.type)
    identity = kernel_identity(prepared.kernel)
    commit, dirty = (request.commit, None) if request.commit else identity.recorded()
    describe = getattr(prepared.kernel, "describe", None)
    versions = {**backend.versions, "convmatrix": __version__}
    versions["python"] = platform.python_version()
    if identity.distribution and identity.version:  # the kernel's own, e.g. causal-conv1d
        versions[identity.distribution] = identity.version
    return RunMeta(
        kernel=prepared.kernel.name,
        matrix=name,
        matrix_hash=digest,
        device_kind=prepared.device.type,
        device_name=backend.devices[0].name if backend.devices else None,
        kernel_commit=commit,
        kernel_dirty=dirty,
        versions=versions,
        label=request.label,
        argv=list(sys.argv),
        options=stored_options(
            replace(request, kernel=prepared.kernel_spec).recorded(),
            matrix_sources=list(prepared.workloads),
            reference_cache=prepared.reference_cache is not None,
            # what the kernel declared its arithmetic to be: the bound, so the bound usage,
            # follows it (compare.errors compares usage only under one declaration)
            arithmetic=declared_arithmetic(prepared.kernel),
            # intra-op threads and OpenMP wait of each process that ran cases (CPU runs)
            threads=prepared.threads.record(int(request.workers), cpu_cores())
            if prepared.device.type == "cpu"
            else None,
            # what the kernel says it loaded (an adapter: the library's version, layout, the
            # interpreter's workarounds...), as JSON; str() for anything JSON cannot hold
            kernel=json.loads(json.dumps(dict(describe()), default=str))
            if callable(describe)
            else None,
        ),
        geometry=dict(describe().get("geometry", {})) if callable(describe) else None,
        n_planned=planned,
        kind=request.kind,
    )


class Controller:
    """Records a run's results exactly once each and closes the run into a ``RunAccount``."""

    def __init__(
        self,
        store: RunStore,
        meta: RunMeta,
        planned: set[str],
        resume: int | None,
        progress: Progress | None = None,
        shard: Shard | None = None,
    ):
        self.store = store
        self.planned = planned
        self.progress = progress
        self.shard = shard
        self.run_id = store.start(meta, resume, shard) if shard else store.start(meta, resume)
        self.results: dict[str, CaseResult] = {}
        self.crashed_workers: Counter[str] = Counter()
        self.account: RunAccount | None = None  # set once the run is closed
        self.known: dict[str, Case] = {}  # planned cases by id (``lost`` needs the case)
        self.min_judged = DEFAULT_MIN_JUDGED  # the share of planned cases to judge to pass
        self.infrastructure: str | None = None  # the machine failed under the run (exit 3)

    def record(self, result: CaseResult) -> bool:
        """Keep one result; False (and nothing kept) if the case already has one or the run
        is closed."""
        if result.case.id in self.results or self.account is not None:
            return False
        self.results[result.case.id] = result
        self.store.add(result)
        if self.progress is not None:
            self.progress.update(result)
        return True

    def crashed(self, case: Case, worker: str | None, detail: str) -> bool:
        """Record the in-flight case of a worker that died (unless it already has a result)."""
        if worker:
            self.crashed_workers[worker] += 1
        message = f"the worker process died while running this case ({detail})"
        return self.record(CaseResult(case=case, outcome="crashed", message=message, worker=worker))

    def _record_lost(self) -> None:
        """A session that ran to its end without a result for some planned case lost it
        (a worker killed from outside, xdist out of worker restarts): ``lost``, so the run
        accounts for every planned case. Cases are found by id among the collected ones."""
        missing = self.planned - set(self.results)
        for case in self.cases_by_id(missing):
            message = "no result arrived for this case (its worker was lost before reporting)"
            self.record(CaseResult(case=case, outcome="lost", message=message))

    def cases_by_id(self, ids: set[str]) -> list[Case]:
        return [self.known[i] for i in sorted(ids) if i in self.known]

    def finish(self, interrupted: bool, signalled: bool = False) -> RunAccount:
        """Close the run: ``finished`` when every planned case has a result, else
        ``interrupted``. Idempotent: a second call returns the first account."""
        if self.account is not None:
            return self.account
        interrupted = interrupted or self.infrastructure is not None
        if not interrupted:
            self._record_lost()
        complete = self.planned <= set(self.results)
        status = "finished" if complete and not interrupted else "interrupted"
        stored = self.store.finish(status)
        failure = self.store.failure() or self.infrastructure  # the database, the machine
        if failure is not None:
            status = "interrupted"
        session = Counter(r.outcome for r in self.results.values())
        self.account = RunAccount(
            run_id=self.run_id,
            status=status,
            counts={o: (stored or session).get(o, 0) for o in OUTCOMES},
            session={o: session.get(o, 0) for o in OUTCOMES},
            planned=len(self.planned),
            worst=worst_failures(self.results.values()),
            where=self.store.where() if self.run_id is not None else None,
            crashed_workers=sum(self.crashed_workers.values()),
            signalled=signalled,
            retried=sum(1 for r in self.results.values() if r.retries),
            shard=str(self.shard) if self.shard else None,
            infrastructure=failure,
            min_judged=self.min_judged,
            skipped=skip_reasons(self.results.values()),
            run_status=self.store.run_status() if self.shard else None,
        )
        return self.account
