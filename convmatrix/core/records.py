"""Plain records of what a run is and what its cases produced: the contract of every layer.

A worker builds a ``CaseResult``; it crosses to the controller as JSON (``to_json`` /
``from_json``, the one wire form); the database stores its fields as columns of the same
names (``convmatrix.db.records``) and gives the same record back to the reports. ``RunMeta``
is what identifies a run (kernel, commit, matrix, device, host) wherever it is recorded.
"""

from __future__ import annotations

import socket
import sys
import uuid
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.sanitise import clean_text

__all__ = [
    "BAD_OUTCOMES",
    "JUDGED",
    "OUTCOMES",
    "RUN_KINDS",
    "CaseResult",
    "ErrorMetrics",
    "OutputMetrics",
    "PropertyResult",
    "RunIdentity",
    "RunMeta",
    "TimingResult",
    "run_identity",
]

# passed/failed: judged (for expect=error cases: raised cleanly / did not);
# skipped: the kernel lacks a feature or the device cannot run it; crashed: the worker died;
# timeout: the per-case time limit passed; error: the harness itself raised; lost: the result
# never arrived (the infrastructure lost it: a worker killed from outside, xdist gave up).
OUTCOMES = ("passed", "failed", "skipped", "crashed", "timeout", "error", "lost")
# Outcomes that fail a run; "skipped" is neither good nor bad.
BAD_OUTCOMES = ("failed", "crashed", "timeout", "error", "lost")
# The kernel's verdicts (a crash included: a kernel that kills its process was judged);
# every other outcome judged nothing (``runners.run.account``: a run that judged too few ends 4).
JUDGED = ("passed", "failed", "crashed")
# What a run is for: only plain runs (``run``) are baselines, ``latest``, history points and
# index rows by default; the others are made to judge something else.
RUN_KINDS = ("run", "confirm", "bisect", "adequacy", "explore", "shrink")


@dataclass(frozen=True)
class ErrorMetrics:
    """What is measured of one output against the float64 reference (docs/spec.md §4)."""

    e_abs: float
    e_rel: float
    e_norm: float
    tau: float  # the e_rel denominator floor: tau_scale x scale
    scale: float  # rms of the reference
    worst_index: list[int] | None  # index of the largest |a - r| (None when empty)


@dataclass
class OutputMetrics:
    """One output's measured errors, the framework path's at the same dtype, the limits the
    verdict applied and the verdict itself (``convmatrix.core.verdict.judge_output``)."""

    output: str  # y, F, dx, dw, db, dS, state
    e_abs: float
    e_rel: float
    e_norm: float
    tau: float  # the e_rel denominator floor, tau_scale x scale
    scale: float  # rms of the reference: the data scale tau is recorded with
    worst_index: list[int] | None = None  # where |a-r| is largest
    fw_abs: float | None = None  # the framework path (torch) at the same dtype
    fw_rel: float | None = None
    fw_norm: float | None = None
    limit_rel: float | None = None
    limit_norm: float | None = None
    passed: bool = True
    bound_usage: float | None = None  # max |a-r| / bound (docs/spec.md §4 bound model)
    limit_usage: float | None = None  # max(e_rel/limit_rel, e_norm/limit_norm): the rows' usage
    usage_limit: float | None = None  # the bound usage allowed, when the bound judged
    # Elements whose bound is zero (an exactly-zero expected value, nothing accumulated) that
    # came out non-zero: counted apart from ``bound_usage``, each fails the bound's verdict.
    broken_zeros: int | None = None


@dataclass
class PropertyResult:
    name: str  # causality | packed_isolation | chunk_consistency | guards | ...
    passed: bool
    detail: str = ""
    # The kernel calls the check made (runners.case.properties); None: stored before they were
    # counted
    forward_calls: int | None = None
    backward_calls: int | None = None


@dataclass
class TimingResult:
    scope: str  # kernel | op | subgraph
    median_s: float
    min_s: float
    iqr_s: float
    n: int
    cold_s: float | None = None
    samples: list[float] = field(default_factory=list)
    mode: str | None = None  # update timing: "reset" | "advance"
    flops: float | None = None
    bytes_moved: float | None = None
    floor_s: float | None = None  # the time floor: max(F / P_eff, t_memcpy(D)) (docs/timing.md)
    efficiency: float | None = None


@dataclass
class CaseResult:
    case: Case
    outcome: str
    duration_s: float = 0.0
    message: str | None = None
    outputs: list[OutputMetrics] = field(default_factory=list)
    properties: list[PropertyResult] = field(default_factory=list)
    timings: list[TimingResult] = field(default_factory=list)
    worker: str | None = None
    peak_mem_mb: float | None = None  # peak memory the kernel's call added (device or RSS)
    host: str | None = None  # where it ran (placement): host name and device index there
    device_index: int | None = None
    retries: int = 0  # resubmissions: a lost actor or node, a crash confirmed elsewhere
    retry_reason: str | None = None
    phases: dict[str, float] = field(
        default_factory=dict
    )  # seconds per phase (runners.case.phases)

    def sanitised(self) -> CaseResult:
        """This result with its message and property details made safe to send and store
        (``core.sanitise.clean_text``); changes the record in place and returns it."""
        self.message = clean_text(self.message)
        for p in self.properties:
            p.detail = clean_text(p.detail) or ""
        return self

    def to_json(self) -> dict[str, Any]:
        """Plain data to send between processes: sanitised here, on the way out, so
        ``from_json`` reads text that is already safe."""
        self.sanitised()
        data = _flat(self)
        data["case"] = self.case.to_json()
        for name in ("outputs", "properties", "timings"):
            data[name] = [_flat(record) for record in data[name]]
        data["phases"] = dict(self.phases)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        return cls(
            case=Case.from_json(data["case"]),
            outcome=data["outcome"],
            duration_s=data.get("duration_s", 0.0),
            message=data.get("message"),
            outputs=[_record(OutputMetrics, o) for o in data.get("outputs", [])],
            properties=[_record(PropertyResult, p) for p in data.get("properties", [])],
            timings=[_record(TimingResult, t) for t in data.get("timings", [])],
            worker=data.get("worker"),
            peak_mem_mb=data.get("peak_mem_mb"),
            host=data.get("host"),
            device_index=data.get("device_index"),
            retries=data.get("retries", 0),
            retry_reason=data.get("retry_reason"),
            phases=dict(data.get("phases") or {}),
        )


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _flat(record: Any) -> dict[str, Any]:
    """A record's fields, lists copied: what ``asdict`` gives for the flat records of a result,
    without its recursive deep copy (which also copied the case only to replace it: most of a
    result's 0.9 ms of ``to_json`` and ``json.dumps``, a case's harness cost)."""
    return {
        name: list(value) if isinstance(value := getattr(record, name), list) else value
        for name in _names(type(record))
    }


# Fields renamed since results were first written (exports and stored JSON keep the old key).
_RENAMED = {"bound_s": "floor_s"}


def _record(cls: type, data: dict[str, Any]) -> Any:
    """A record from its JSON form; keys the record does not know are ignored."""
    known = _names(cls)
    data = {_RENAMED.get(k, k): v for k, v in data.items()}
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RunMeta:
    """What identifies a run: kernel and commit, matrix, device, host, versions, label."""

    kernel: str
    matrix: str
    matrix_hash: str
    device_kind: str = "cpu"
    device_name: str | None = None
    kernel_commit: str | None = None
    kernel_dirty: bool | None = None
    host: str = field(default_factory=socket.gethostname)
    versions: dict[str, str | None] = field(default_factory=dict)  # torch, cuda, torch_mlu, ...
    label: str | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    options: dict[str, Any] = field(default_factory=dict)
    geometry: dict[str, Any] | None = None
    n_planned: int | None = None
    kind: str = "run"  # run | confirm | bisect | adequacy: only plain runs are baselines
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # kept by export and import


@dataclass(frozen=True)
class RunIdentity:
    """What makes two sessions parts of one run (the shards of ``--run-label``): the kernel
    and its commit, the matrix (by content) and the kind of device. The matrix's name is
    shown, not compared."""

    kernel: str
    kernel_commit: str | None
    matrix_hash: str
    device_kind: str
    matrix: str = field(default="", compare=False)

    def __str__(self) -> str:
        commit = (self.kernel_commit or "unknown")[:12]
        return (
            f"kernel {self.kernel} at commit {commit}, matrix {self.matrix or '?'} "
            f"({self.matrix_hash[:12]}), on {self.device_kind}"
        )


def run_identity(run: Any) -> RunIdentity:
    """The identity of a ``RunMeta`` or of a stored run (anything with those attributes)."""
    return RunIdentity(
        run.kernel, run.kernel_commit, run.matrix_hash, run.device_kind, run.matrix or ""
    )
