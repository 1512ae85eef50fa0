"""One candidate case judged exactly as ``convmatrix run`` judges a case of its matrix.

A search (shrink, explore) asks of many cases no matrix lists: does this one fail, and the
same way? The ``Probe`` answers through the run's own machinery, never a shortcut: the
options are resolved by the run's ``prepare`` (kernel spec, device, the matrix's tolerances,
policy and memory budget, ``--policy``, the reference's device and cache), the case is put to
the kernel's contract as ``expand_matrix`` puts every case (outside it: an expected-error
case), and ``run_guarded`` executes and judges it (tensors with NaN guards, the kernel, the
float64 reference, the torch path, property checks, the verdict). With ``isolate`` each case
runs in the child process the Ray executor uses (``runners.executors.isolated``): a kernel that
kills its process, or hangs past the per-case limit, gives a ``crashed`` / ``timeout`` outcome
instead of ending the search.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.matrix.build import spec_violation
from convmatrix.runners.case.execute import run_guarded
from convmatrix.runners.executors.isolated import ChildSpec, IsolatedRunner
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import Prepared, prepare
from convmatrix.runners.run.store import MemoryStore
from convmatrix.runners.run.workload import Workload

__all__ = ["Probe", "ProbeOutcome", "signature_of"]

_RAISED = re.compile(r"(?:kernel )?raised (\w+)")


def signature_of(result: CaseResult) -> str:
    """What failed, as text two failures can be compared by: the outcome, the exception the
    kernel raised (its type) and the failing outputs and property checks, sorted.
    ``""`` for a case that did not fail. E.g. ``failed: y,dx,causality``, ``failed: raised
    IndexError``, ``crashed``."""
    if result.outcome not in BAD_OUTCOMES:
        return ""
    parts = sorted(o.output for o in result.outputs if not o.passed)
    parts += sorted(p.name for p in result.properties if not p.passed)
    raised = _RAISED.search(result.message or "")
    if raised and result.outcome == "failed":
        parts.insert(0, f"raised {raised.group(1)}")
    if not parts and "memory_budget_mb" in (result.message or ""):
        parts.append("memory")
    return result.outcome + (": " + ",".join(parts) if parts else "")


def _parts(signature: str) -> tuple[str, set[str]]:
    outcome, _, rest = signature.partition(": ")
    return outcome, {p for p in rest.split(",") if p}


@dataclass(frozen=True)
class ProbeOutcome:
    """One candidate's verdict: ``outcome`` is the run's outcome word (passed, failed,
    skipped, crashed, timeout, error), ``signature`` what failed (``signature_of``)."""

    failed: bool
    outcome: str
    signature: str
    seconds: float
    result: CaseResult | None = field(default=None, compare=False, repr=False)

    def same_failure(self, other: ProbeOutcome) -> bool:
        """Whether this is the failure ``other`` is: both failed with the same outcome and
        the same exception, and (when both name failing outputs or checks) at least one
        in common. Outputs come and go with the features a shrink turns off (no final
        state, no F), so the sets are not asked to be equal."""
        if not (self.failed and other.failed):
            return False
        (mine, own), (theirs, seen) = _parts(self.signature), _parts(other.signature)
        if mine != theirs:
            return False
        raised = {p for p in own | seen if p.startswith("raised ")}
        if raised and not (raised <= own and raised <= seen):
            return False
        return not own or not seen or bool(own & seen)


class Probe:
    """Judges candidate cases on one kernel and device under one policy, as a run would.

    ``options`` are a run's (``RunOptions``: ``kernel``, ``device``, ``matrix`` for its
    tolerances, policy, memory budget and per-case timeout, ``rule`` for ``--policy``,
    ``reference_device``, ``reference_cache``); no matrix: the defaults a run of a cases
    file gets. ``runs`` counts the cases judged, ``history`` keeps them in order.
    """

    def __init__(self, options: RunOptions, *, isolate: bool = False) -> None:
        self.options = replace(options, workers=0, cases=[], resume=None, shard=None)
        self.prepared: Prepared = prepare(self.options, MemoryStore())
        loaded = list(self.prepared.workloads.values())
        self.workload = loaded[0] if loaded else Workload("probe", "probe", "", [])
        self.context = self.prepared.context(self.workload)
        self.kernel: Any = self.prepared.kernel
        self.timeout_s = self.prepared.timeout_s or self.workload.timeout_s
        self.runs = 0
        self.history: list[tuple[Case, ProbeOutcome]] = []
        self._isolated: IsolatedRunner | None = None
        if isolate:
            if not loaded:
                raise ValueError("an isolated probe needs the run's matrix (options.matrix)")
            device = str(self.prepared.device)
            spec = ChildSpec(self.prepared.handover(), device, None, None)
            self._isolated = IsolatedRunner(spec)

    @property
    def geometry(self) -> dict[str, int]:
        """The kernel's declared geometry symbols (``tile``, ``ctile``, ``vec``, ``P``)."""
        return dict(self.kernel.capabilities.geometry.symbols())

    def violation(self, case: Case) -> str | None:
        """Why the case is outside docs/spec.md §2 or the kernel's contract (the same two
        questions ``expand_matrix`` asks of every case of a matrix), or None."""
        return spec_violation(case) or self.kernel.contract_violation(case)

    def classified(self, case: Case) -> Case:
        """``case`` as a matrix would hold it: outside the contract, an expected-error case."""
        if case.expect != "ok":
            return case
        reason = self.violation(case)
        if reason is None:
            return case
        return replace(case, expect="error", expect_reason=reason, id=case.id)

    def judge(self, case: Case) -> ProbeOutcome:
        """Run ``case`` through ``run_guarded`` (in the isolated child with ``isolate``) and
        say whether it failed and what failed."""
        case = self.classified(case)
        start = time.perf_counter()
        if self._isolated is not None:
            try:
                result = self._isolated.run(self.workload.source, case, self.timeout_s)
            except KeyboardInterrupt:  # a signal: the case in flight is abandoned, not awaited
                self._isolated.kill()
                raise
        else:
            result = run_guarded(case, self.context)
        outcome = ProbeOutcome(
            failed=result.outcome in BAD_OUTCOMES,
            outcome=result.outcome,
            signature=signature_of(result),
            seconds=time.perf_counter() - start,
            result=result,
        )
        self.runs += 1
        self.history.append((case, outcome))
        return outcome

    def close(self) -> None:
        """End the isolated child, if any (a probe without one holds nothing)."""
        if self._isolated is not None:
            self._isolated.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
