"""Plain records of what a case produced: the contract between runners, database and reports.

Workers build a ``CaseResult``, ship it to the controller as JSON (through pytest's report
machinery), and the controller hands batches of them to ``convmatrix.db`` to store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from convmatrix.matrix.case import Case

__all__ = ["OUTCOMES", "CaseResult", "OutputMetrics", "PropertyResult", "TimingResult"]

# passed/failed: judged (for expect=error cases: raised cleanly / did not);
# skipped: the kernel lacks a feature or the device cannot run it; crashed: the worker died;
# timeout: the per-case time limit passed; error: the harness itself raised.
OUTCOMES = ("passed", "failed", "skipped", "crashed", "timeout", "error")


@dataclass
class OutputMetrics:
    """Errors of one output (y, F, dx, dw, db, dS, state) against the float64 reference."""

    output: str
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


@dataclass
class PropertyResult:
    name: str  # causality | packed_isolation | chunk_consistency | guards | ...
    passed: bool
    detail: str = ""


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
    bound_s: float | None = None
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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["case"] = self.case.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        return cls(
            case=Case.from_json(data["case"]),
            outcome=data["outcome"],
            duration_s=data.get("duration_s", 0.0),
            message=data.get("message"),
            outputs=[OutputMetrics(**o) for o in data.get("outputs", [])],
            properties=[PropertyResult(**p) for p in data.get("properties", [])],
            timings=[TimingResult(**t) for t in data.get("timings", [])],
            worker=data.get("worker"),
        )
