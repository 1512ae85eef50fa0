"""Running one case: tensors, kernel, float64 reference, torch path, guards, properties, verdict.

``run_case`` never raises for anything the kernel does: a kernel exception on an in-contract
case is a ``failed`` result with the exception in its message; only a bug of the harness itself
escapes (the pytest item turns it into an ``error`` result). Expected-error cases
(``case.expect == "error"``) pass only when the kernel raises ``ContractError`` or one of its
declared ``capabilities.error_types``; returning normally or raising anything else fails.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities, ContractError
from convmatrix.core.records import CaseResult
from convmatrix.core.sanitise import safe_str
from convmatrix.core.tolerances import OUTPUTS, PARAM_GRADS, Policy, Tolerances
from convmatrix.core.verdict import judge_output, outcome_of, tolerance_for
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.matrix.spec import TimingSettings
from convmatrix.runners.case.bounds import usage_of, zero_floor
from convmatrix.runners.case.defaults import ProcessState, note_changes, take_changes
from convmatrix.runners.case.guards import fresh_copy, keep_pristine
from convmatrix.runners.case.inputs import ForwardInputs, UpdateInputs, build_forward, build_update
from convmatrix.runners.case.interrupts import is_real_interrupt, kernel_crash_message
from convmatrix.runners.case.invoke import KernelFault, check_outputs, kernel_outputs
from convmatrix.runners.case.memory import PeakMemory
from convmatrix.runners.case.metrics import ErrorSums, abs_diff
from convmatrix.runners.case.output import CappedOutput
from convmatrix.runners.case.phases import Between, Phases
from convmatrix.runners.case.processes import CaseProcesses
from convmatrix.runners.case.properties import (
    MainCall,
    PropertyRun,
    check_guards,
    restore,
    run_properties,
)
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.key import BoundSpec
from convmatrix.runners.case.reference import channel_blocks, channels_of, judged_blocks

__all__ = [
    "CaseMemo",
    "Context",
    "build_inputs",
    "case_work",
    "run_case",
    "run_guarded",
    "skip_reason",
]

# Outputs that are copies of inputs: a kernel must reproduce them bit for bit unless it sets
# ``exact_state = False`` (e.g. it stores the state in another dtype).
_EXACT = ("state",)
# Where the channels are in each output: dw (C, K) and db (C,) lead with them.
_CHANNEL_DIM = {name: 0 if name in PARAM_GRADS else 1 for name in OUTPUTS}


@dataclass
class CaseMemo:
    """The torch path's outputs, kept for the next kernel on the same case: a case's tensors
    are a function of the case alone (seeded by its id), so they are too. Holds one case.

    For comparing several kernels case by case (``benchmarks/bench_bounds.py``): at C=4128,
    L=4096 the torch path is a fifth of a case's time.
    """

    case_id: str | None = None
    framework: dict | None = None

    def of(self, case: Case) -> CaseMemo:
        if case.id != self.case_id:
            self.case_id, self.framework = case.id, None
        return self


@dataclass
class Context:
    """What every case of a run shares."""

    kernel: Any
    tolerances: Tolerances = field(default_factory=Tolerances)
    policy: Policy = field(default_factory=Policy)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    framework: Any = field(default_factory=TorchKernel)
    timing: TimingSettings = field(default_factory=TimingSettings)  # for ``case.timed`` cases
    memory_budget_mb: float = 8192.0  # peak memory a case may add (the matrix's key)
    memo: CaseMemo | None = None  # shared by the contexts of several kernels (CaseMemo)
    reference_device: torch.device | None = None  # where the reference runs (None: the host)
    reference_cache: ReferenceCache | None = None  # references computed before (None: off)


def skip_reason(kernel: Any, case: Case) -> str | None:
    """Why this kernel cannot run the case here (a skip, not a failure), or None."""
    reason = kernel.availability()
    if reason:
        return f"kernel {kernel.name!r} unavailable: {reason}"
    missing = kernel.capabilities.missing_features(case)
    if missing and case.expect != "error":
        return f"kernel {kernel.name!r} lacks feature(s) {', '.join(missing)}"
    return None


def build_inputs(
    case: Case, device: torch.device, contract: Capabilities | None = None
) -> ForwardInputs | UpdateInputs:
    """A case's tensors, as the kernel declaring ``contract`` takes them (slot ids)."""
    if case.op == "update":
        return build_update(case, device, contract)
    return build_forward(case, device)


def _expect_error(case: Case, ctx: Context) -> tuple[str, str]:
    """(outcome, message) of an expected-error case: call once and look at what comes back."""
    inputs = build_inputs(case, ctx.device, ctx.kernel.capabilities)
    accepted = (ContractError, *tuple(ctx.kernel.capabilities.error_types))
    try:
        if isinstance(inputs, UpdateInputs):
            x = inputs.xs[0]
            ctx.kernel.update(
                x.view,
                inputs.pool.view,
                inputs.weight.view,
                None if inputs.bias is None else inputs.bias.view,
                activation=case.activation,
                cache_seqlens=None if inputs.cache_seqlens is None else inputs.cache_seqlens[0],
                state_indices=inputs.slots,
            )
        else:
            ctx.kernel.forward(
                inputs.x.view,
                inputs.weight.view,
                None if inputs.bias is None else inputs.bias.view,
                initial_state=None if inputs.initial_state is None else inputs.initial_state.view,
                seq_idx=inputs.seq_idx,
                return_final_state=bool(case.final_state),
                activation=case.activation,
            )
    except accepted as exc:
        return "passed", f"raised {type(exc).__name__}: {safe_str(exc)}"
    except Exception as exc:
        names = ", ".join(t.__name__ for t in accepted)
        return "failed", f"raised {type(exc).__name__} ({safe_str(exc)}), expected one of: {names}"
    why = case.expect_reason or "outside the kernel's contract"
    return "failed", f"returned normally; expected a clean error ({why})"


def _framework_outputs(
    case: Case, ctx: Context, own: dict, inputs: ForwardInputs | UpdateInputs
) -> dict | None:
    """The torch path's outputs on fresh copies of the same values (None if it raised):
    copies of the case's placed inputs (``guards.fresh_copy``), or for an update, whose
    slots follow each kernel's contract, drawn for the torch path."""
    memo = None if ctx.memo is None else ctx.memo.of(case)
    if memo is not None and memo.framework is not None:
        return memo.framework
    if type(ctx.kernel) is TorchKernel:  # the torch path itself: no second run
        fw: dict | None = own
    else:
        try:
            if isinstance(inputs, ForwardInputs):
                fw_inputs: ForwardInputs | UpdateInputs = fresh_copy(inputs)
            else:
                fw_inputs = build_inputs(case, ctx.device, ctx.framework.capabilities)
            fw = kernel_outputs(ctx.framework, case, fw_inputs)
        except KernelFault:
            fw = None
    if memo is not None:
        memo.framework = fw
    return fw


def _timed(items: Iterator[Any], phases: Phases, name: str) -> Iterator[Any]:
    """``items``, the time spent producing each one added to phase ``name``."""
    while True:
        start = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            phases.add(name, time.perf_counter() - start)
            return
        phases.add(name, time.perf_counter() - start)
        yield item


def _metrics(
    case: Case,
    ctx: Context,
    inputs: ForwardInputs | UpdateInputs,
    got: dict,
    fw: dict | None,
    phases: Phases,
    checks: PropertyRun | None = None,
) -> list:
    """Every output judged against the reference, computed and compared channel block by
    channel block (``channel_blocks``); the errors add up over the blocks, and each block's
    bound judges the property checks' bounded comparisons too (``checks``). Time spent on the
    reference goes to phase ``reference``, on the checks to ``properties``, the rest to
    ``metrics``."""
    start = time.perf_counter()
    before = phases.seconds.get("reference", 0.0) + phases.seconds.get("properties", 0.0)
    exact = getattr(ctx.kernel, "exact_state", True)
    blocks = channel_blocks(case, inputs)
    sums: dict[str, ErrorSums] = {}
    fw_sums: dict[str, ErrorSums] = {}
    usage: dict[str, float] = {}
    zeros: dict[str, int] = {}  # elements expected exactly 0 that came out non-zero
    spec = BoundSpec(ctx.kernel.capabilities, ctx.policy)
    reference = judged_blocks(
        case, inputs, blocks, spec, device=ctx.reference_device, cache=ctx.reference_cache
    )
    for block, (ref, bounds, slack) in _timed(reference, phases, "reference"):
        for name, r in ref.items():
            dim = _CHANNEL_DIM[name]
            if name not in sums:
                sums[name] = _sums_for(name, got, r, block, dim, inputs)
                if fw is not None and name in fw and fw[name] is not got[name]:
                    fw_sums[name] = ErrorSums(sums[name].shape, dim, sums[name].r_store)
            a = channels_of(got[name], block, dim)
            diff = abs_diff(a, r)
            sums[name].add(block, a, r, diff)
            if name in fw_sums and fw is not None:
                fw_sums[name].add(block, channels_of(fw[name], block, dim), r, None)
            if name in bounds:
                got_usage = usage_of(a, r, bounds[name], zero_floor(case, name), diff=diff)
                usage[name] = max(usage.get(name, 0.0), got_usage.usage)
                zeros[name] = zeros.get(name, 0) + got_usage.broken_zeros
                if checks is not None:
                    with phases("properties"):
                        checks.judge(name, block, dim, bounds[name], slack.get(name))
    judged = []
    for name, s in sums.items():
        m = s.metrics(got[name], ctx.policy.tau_scale)
        fm = None
        if fw is not None and name in fw_sums:
            fm = fw_sums[name].metrics(fw[name], ctx.policy.tau_scale)
        elif fw is not None and name in fw:  # the torch path itself: the same numbers
            fm = m
        tol = tolerance_for(ctx.tolerances, case, name)
        is_exact = exact and name in _EXACT
        verdict = judge_output(
            name, m, fm, tol, ctx.policy, exact=is_exact, bound_usage=usage.get(name),
            broken_zeros=zeros.get(name),
        )  # fmt: skip
        judged.append(verdict)
    elsewhere = phases.seconds.get("reference", 0.0) + phases.seconds.get("properties", 0.0)
    phases.add("metrics", time.perf_counter() - start - (elsewhere - before))
    return judged


def _sums_for(
    name: str, got: dict, r: torch.Tensor, block: slice | None, dim: int, inputs: Any
) -> ErrorSums:
    """The accumulator of one output, once its shape is checked against the reference's."""
    if name not in got:
        raise KernelFault(f"the kernel produced no {name}")
    shape = list(r.shape)
    if block is not None:
        shape[dim] = inputs.x.values.shape[1]
    if tuple(got[name].shape) != tuple(shape):
        have = tuple(got[name].shape)
        raise KernelFault(f"{name}: shape {have} differs from the reference's {tuple(shape)}")
    # One block: the reference itself is the store ErrorSums keeps (no copy of it).
    store = r.to(torch.float64) if block is None else None
    return ErrorSums(tuple(shape), dim, store, device=r.device)


def _time(case: Case, ctx: Context, result: CaseResult) -> None:
    """Time a passed ``timed`` case after judging it, on fresh inputs (never inside the
    comparison). A kernel that raises here, having passed, makes the case an ``error``."""
    from convmatrix.runners.case.timing.cases import time_case

    try:
        result.timings = time_case(ctx.kernel, case, ctx.device, ctx.timing, ctx.framework)
    except Exception as exc:
        result.outcome = "error"
        result.message = f"timing raised {type(exc).__name__}: {safe_str(exc)}"


def _execute(case: Case, ctx: Context, result: CaseResult, phases: Phases) -> None:
    reason = skip_reason(ctx.kernel, case)
    if reason:
        result.outcome, result.message = "skipped", reason
    elif case.expect == "error":
        with _kernel_call(ctx, result, phases):
            result.outcome, result.message = _expect_error(case, ctx)
    else:
        with phases("inputs"):
            inputs = build_inputs(case, ctx.device, ctx.kernel.capabilities)
            keep_pristine(inputs)  # what every guard check after a call compares with
        if case.op == "fwd_bwd":
            _autograd_imported()
        try:
            with _kernel_call(ctx, result, phases):
                got = kernel_outputs(ctx.kernel, case, inputs)
                check_outputs(got, inputs)
            with phases("properties"):
                checks = _checks(case, ctx, inputs, got, result)
            with phases("framework"):
                fw = _framework_outputs(case, ctx, got, inputs)
            result.outputs = _metrics(case, ctx, inputs, got, fw, phases, checks)
            with phases("properties"):
                result.properties += checks.results()
            result.outcome = outcome_of(result)
            if case.timed and result.outcome == "passed":
                with phases("timing"):
                    _time(case, ctx, result)
        except KernelFault as exc:
            result.outcome, result.message = "failed", safe_str(exc)
            if not result.properties:
                result.properties.append(check_guards(inputs, ctx.kernel.capabilities))


def _checks(
    case: Case, ctx: Context, inputs: ForwardInputs | UpdateInputs, got: dict, result: CaseResult
) -> PropertyRun:
    """The guards of the main call (recorded now), then the property checks' kernel calls
    on the main call's inputs (restored first if the main call broke them) and outputs;
    their bounded comparisons wait for the main reference (``_metrics``)."""
    guards = check_guards(inputs, ctx.kernel.capabilities)
    result.properties.append(guards)
    if not isinstance(inputs, ForwardInputs):
        return PropertyRun([])
    if not guards.passed:
        restore(inputs.guarded())
    return run_properties(ctx.kernel, case, ctx.policy, ctx.device, MainCall(inputs, got))


@cache
def _autograd_imported() -> None:
    """torch imports ``torch.fx.experimental.symbolic_shapes`` on a process's first backward
    (``autograd._make_grads``): 2-5 s on a loaded machine, which fell in the kernel phase of
    each worker's first ``fwd_bwd`` case. Imported before the call, it is the case's
    ``harness`` time, once per process."""
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


@contextmanager
def _kernel_call(ctx: Context, result: CaseResult, phases: Phases) -> Iterator[None]:
    """The kernel's call: its ``kernel`` phase, and the peak memory held against the
    matrix's ``memory_budget_mb``. Only the call is measured: the inputs made before it and
    the float64 reference, metrics and checks after it are the harness's (on the CPU, the
    process's memory; on a device, a reference computed there), and counting them failed a
    correct kernel on a 4.3e7-element case at 8.5 GB (found by ``convmatrix explore``)."""
    memory = PeakMemory(ctx.device)
    try:
        with phases("kernel"), memory:
            yield
    finally:
        result.peak_mem_mb = memory.peak_mb


def _over_budget(result: CaseResult, budget_mb: float) -> None:
    """A case whose peak memory passed the matrix's ``memory_budget_mb`` fails, saying so."""
    peak = result.peak_mem_mb
    if peak is None or peak <= budget_mb or result.outcome not in ("passed", "failed"):
        return
    note = f"peak memory {peak:.0f} MB over the matrix's memory_budget_mb {budget_mb:g}"
    result.outcome = "failed"
    result.message = note if not result.message else f"{result.message}; {note}"


def _note(result: CaseResult, note: str) -> None:
    result.message = note if not result.message else f"{result.message}; {note}"


def case_work(case: Case, ctx: Context) -> CaseResult:
    """The work of one case alone (inputs, kernel, reference, torch path, metrics, checks,
    verdict), without ``run_case``'s guards: what a bare loop times against the harness
    (benchmarks/bench_harness.py)."""
    result = CaseResult(case=case, outcome="passed")
    _execute(case, ctx, result, Phases())
    return result


def run_case(case: Case, ctx: Context) -> CaseResult:
    """Execute and judge one case on ``ctx.device``.

    A ``BaseException`` the kernel raises (``SystemExit``, its own ``KeyboardInterrupt``)
    makes the case ``crashed``; only a real interrupt (a signal) leaves. Processes the case
    started end with it (its descendants, and those carrying its environment token after a
    ``setsid``); the kernel call's peak memory is recorded and held against the budget;
    torch's defaults, the recursion limit and the signal handlers are as they were before it
    (each kernel call restores them, ``runners.case.defaults``), and the message names what the
    kernel changed.
    """
    start = time.perf_counter()
    result = CaseResult(case=case, outcome="passed")
    phases = Phases()
    state = ProcessState.capture()
    take_changes()  # what an earlier case left unsaid is not this case's
    try:
        with CaseProcesses() as procs:
            try:
                _execute(case, ctx, result, phases)
            except Exception:
                raise  # a harness bug: the caller records it as an error
            except BaseException as exc:
                if is_real_interrupt(exc):
                    raise
                result.outcome, result.message = "crashed", kernel_crash_message(exc)
    finally:
        note_changes(state.restore())
    _over_budget(result, ctx.memory_budget_mb)
    if procs.ended:
        _note(result, f"ended {len(procs.ended)} process(es) the case left running")
    changed = take_changes()
    if changed:
        name = getattr(ctx.kernel, "name", type(ctx.kernel).__name__)
        _note(result, f"kernel {name!r} changed the process's {'; '.join(changed)}")
    result.duration_s = time.perf_counter() - start
    result.phases = phases.close(result.duration_s)
    return result.sanitised()


_BETWEEN = Between()  # this process's cases, one after another


def run_guarded(case: Case, ctx: Context) -> CaseResult:
    """``run_case`` as every executor calls it: a bug of the harness itself becomes an ``error``
    result for this case (with the end of its traceback) and the run goes on. What the kernel
    prints is bounded (``runners.case.output``: its head and tail, the rest counted) before pytest,
    xdist or Ray see it. The time since this process's previous case is the result's phase
    ``between`` (``runners.case.phases``)."""
    between = _BETWEEN.start()
    try:
        with CappedOutput():
            try:
                result = run_case(case, ctx)
            except Exception as exc:
                tail = "".join(traceback.format_exception(exc, limit=-4))
                result = CaseResult(case, "error", message=f"harness error: {tail}").sanitised()
    finally:
        _BETWEEN.end()
    if between is not None:
        result.phases["between"] = round(between, 6)
    return result
