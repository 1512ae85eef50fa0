"""Property checks besides the numeric comparison (docs/spec.md §3), kernel against itself.

- guards: the storage around every view is still NaN, inputs hold their values, and an update
  touched no pool row that no slot names;
- causality: changing only future inputs ``x[t+1:]`` leaves ``y[:t+1]`` unchanged;
- packed isolation: changing every other packed sample leaves the samples between unchanged
  (on a packed case that asks for both, one changed forward serves causality too: ``Perturbation``);
- chunk consistency: two chunks with the state carried across (and its gradient flowing back)
  equal one whole call, forward and backward.

Every check works from the case's own main call (``MainCall``: its inputs and outputs): the
whole call of each comparison *is* the main call, so causality and packed isolation call only
the forward on the changed inputs, and chunk consistency only the two chunks. Where a check
keeps a tolerance, its bound is the main verdict's, read as the reference streams past block
by block (``runners.case.agreement``): no check computes a float64 reference of its own.

Causality and packed isolation are exact: a deterministic forward's unaffected outputs do not
depend on the changed inputs at all, so they must not change by a single bit, however small
a leak; the largest difference is reported. A kernel that declares its forward
nondeterministic (``Capabilities.deterministic = False``) is held to the bound model instead.
Chunk consistency changes reduction orders, so it keeps a tolerance, derived from the same
bounds (docs/spec.md §4): each side may be ``safety`` bounds from the reference, so the two
may differ by twice that, element by element.

Each check counts the kernel calls it makes (``PropertyResult.forward_calls`` and
``backward_calls``: a chunked backward calls the kernel's backward once per chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.records import PropertyResult
from convmatrix.core.sanitise import safe_str
from convmatrix.core.tolerances import Policy
from convmatrix.runners.case.agreement import (
    Agreement,
    Calls,
    Changed,
    MainCall,
    PendingAgreement,
    identical,
)
from convmatrix.runners.case.applicability import not_applicable, refused_call
from convmatrix.runners.case.chunks import chunk_consistency
from convmatrix.runners.case.guards import (
    check_guards,
    damage,
    restore,
    runs,
    same_bits,
)
from convmatrix.runners.case.inputs import ForwardInputs, recording_placed
from convmatrix.runners.case.invoke import KernelFault, call_forward

__all__ = [
    "PROPERTIES",
    "MainCall",
    "PropertyRun",
    "check_guards",
    "restore",
    "run_properties",
    "run_property",
]


Spans = tuple[tuple[int, int], ...]  # runs of time steps, (start, stop) each


@dataclass(frozen=True)
class Perturbation:
    """The time steps of x one changed forward replaces (``tokens``), and what each check
    keeps: causality ``y[:cut+1]``, packed isolation the time steps in ``kept``.

    On a packed case that asks for both checks, one changed forward serves the two (their
    kernel calls are most of what the checks cost): the samples of one parity are changed
    after a cut inside one of them that has a sample after it. A look-ahead then shows at
    the cut (the next time step is in the same changed sample) and at the end of every kept
    sample before a changed one; a leak across samples, in every kept sample after a changed
    one. Alone, each check changes what it always did: causality every time step after the
    middle, packed isolation the even-numbered samples.
    """

    tokens: Spans  # the changed time steps
    cut: int
    kept: Spans | None  # packed isolation's (None: the case is not packed)
    label: str


def _spans(mask: torch.Tensor) -> Spans:
    return tuple((r.start, r.stop) for r in runs(mask))


def perturbation_for(case: Case, main: MainCall, check: str) -> Perturbation:
    """The change ``check`` (causality or packed isolation) makes on ``case`` (``Perturbation``)."""
    length = main.inputs.x.values.shape[2]
    middle = length // 2
    alone = Perturbation(((middle + 1, length),), middle, None, f"changing x[{middle + 1}:]")
    if main.inputs.seq_idx is None:
        return alone
    ids = main.inputs.seq_idx[0].cpu()
    samples = _samples(ids)  # (id, start, stop), in order
    # a cut with cut + 1 in the same sample, one with a sample after it, nearest the middle
    fits = []
    for sid, start, stop in samples[:-1]:
        if stop - start >= 2:
            cut = min(max(middle, start), stop - 2)
            fits.append((abs(cut - middle), cut, sid))
    if not fits or not {"causality", "packed_isolation"} <= set(case.checks):
        if check == "causality":
            return alone
        even, odd = (ids >= 0) & (ids % 2 == 0), (ids >= 0) & (ids % 2 == 1)
        return Perturbation(_spans(even), middle, _spans(odd), "changing even samples")
    _, cut, sid = min(fits)
    same = (ids >= 0) & (ids % 2 == sid % 2)
    changed = same & (torch.arange(ids.numel()) > cut)
    which = "odd" if sid % 2 else "even"
    label = f"changing x[{cut + 1}:] of the {which} samples"
    return Perturbation(_spans(changed), cut, _spans((ids >= 0) & ~same), label)


def _samples(ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """A packed row's samples: (id, start, stop), padding (id < 0) left out."""
    starts = [0, *(torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist()]
    stops = [*starts[1:], ids.numel()]
    return [(int(ids[a]), a, b) for a, b in zip(starts, stops, strict=True) if ids[a] >= 0]


def _changed_forward(kernel: Any, case: Case, main: MainCall, change: Perturbation) -> Changed:
    """y of the main call's forward (same arguments) on x with ``change``'s time steps
    negated; made once per change, the checks that share it reuse it (``MainCall.changed``).

    x is changed where it lies, in the main call's own storage (layout, gaps and guard
    bands as the case placed them), and negated back after the call: negation is exact
    and undoes itself bit for bit, so the guards checked after the check (``run_property``)
    see any write of the kernel's into x or around it as damage to x. A changed copy cost
    two fresh copies of x's storage (f32 C=5120 L=2048: 0.25x the case's kernel phase)."""
    if change.tokens in main.changed:
        return main.changed[change.tokens]
    fi = main.inputs
    v = fi.x.view
    x = fi.x.base.detach().as_strided(v.shape, v.stride(), v.storage_offset())
    with torch.no_grad():
        _negate(x, change.tokens)
        try:
            main.calls.forward += 1
            y = call_forward(
                kernel,
                case,
                x,
                fi.weight.view,
                None if fi.bias is None else fi.bias.view,
                None if fi.initial_state is None else fi.initial_state.view,
                fi.seq_idx,
                bool(case.final_state),
            )[0]
        finally:
            _negate(x, change.tokens)
    main.changed[change.tokens] = Changed(y)
    return main.changed[change.tokens]


def _negate(x: torch.Tensor, tokens: Spans) -> None:
    for a, b in tokens:
        x[..., a:b].neg_()


def _unaffected(
    name: str,
    kernel: Any,
    policy: Policy,
    main: MainCall,
    changed: Changed,
    kept: Spans,
    ok: str,
) -> PendingAgreement:
    """y where a change must not reach (the time steps in ``kept``): identical to the main y
    for a deterministic kernel (judged now), else within the main y's bounds (judged as the
    reference streams). Compared span by span first: gathering a packed row's kept samples
    through a mask cost the packed case's check 0.7x its kernel call; only a difference
    gathers them, to say how many and where."""
    before, after = main.outputs["y"], changed.y
    deterministic = kernel.capabilities.deterministic
    unseen = changed.unseen(kept)
    if deterministic and all(same_bits(after[..., a:b], before[..., a:b]) for a, b in unseen):
        changed.same += unseen
        return PendingAgreement(main.calls, ok)
    mask = torch.zeros(before.shape[-1], dtype=torch.bool)
    for a, b in kept:
        mask[a:b] = True

    def select(t: torch.Tensor) -> torch.Tensor:
        return t[..., mask.to(t.device)]

    if deterministic:
        problem = identical(name, select(after), select(before))
        return PendingAgreement(main.calls, ok, problems=[problem] if problem else [])
    agreement = Agreement(name, "y", after, before, 2 * policy.safety, select=select)
    return PendingAgreement(main.calls, ok, [agreement])


def causality(
    kernel: Any, case: Case, policy: Policy, device: torch.device, main: MainCall
) -> PendingAgreement:
    change = perturbation_for(case, main, "causality")
    changed = _changed_forward(kernel, case, main, change)
    keep = change.cut + 1
    return _unaffected(
        change.label, kernel, policy, main, changed, ((0, keep),), f"y[:{keep}] unchanged"
    )


def packed_isolation(
    kernel: Any, case: Case, policy: Policy, device: torch.device, main: MainCall
) -> PendingAgreement:
    """Change the samples of one parity (after a cut, where causality shares the call); the
    other parity's samples' outputs must not move."""
    change = perturbation_for(case, main, "packed_isolation")
    assert change.kept is not None
    if not change.kept:
        return PendingAgreement(main.calls, "only one sample: nothing to isolate")
    changed = _changed_forward(kernel, case, main, change)
    return _unaffected(
        change.label, kernel, policy, main, changed, change.kept, "the other samples unchanged"
    )


Check = Callable[[Any, Case, Policy, torch.device, MainCall], PendingAgreement]

PROPERTIES: dict[str, Check] = {
    "causality": causality,
    "packed_isolation": packed_isolation,
    "chunk_consistency": chunk_consistency,
}


def run_property(
    name: str, kernel: Any, case: Case, policy: Policy, device: torch.device, main: MainCall
) -> PendingAgreement:
    """One check's calls, only if the kernel's contract accepts every call it makes (else not
    applicable, with the reason); a kernel that raises fails this check alone, by name."""
    refused = refused_call(kernel, name, case)
    if refused:
        return PendingAgreement(Calls(), result=not_applicable(name, refused))
    calls = Calls()
    own = MainCall(main.inputs, main.outputs, calls, changed=main.changed)
    with recording_placed() as placed:
        try:
            pending = PROPERTIES[name](kernel, case, policy, device, own)
        except KernelFault as exc:
            pending = PendingAgreement(calls, result=PropertyResult(name, False, safe_str(exc)))
    # The check's calls are held to the guards too, on what it placed and on the main call's
    # inputs it reuses: a write outside a view (or into an input) made only on these calls
    # went unseen when only the main call was guarded. Damage is repaired for the next check.
    # A check that made no call (packed isolation judging causality's) changed nothing.
    made_calls = calls.forward or calls.backward or placed
    broken = damage([*placed, *main.inputs.guarded()]) if made_calls else []
    if broken:
        pending.guard_damage = f"guards broken by this check's calls: {'; '.join(broken)}"
        restore(main.inputs.guarded())
    return pending


@dataclass
class PropertyRun:
    """The checks of one case, their kernel calls made: what is left waits for the main
    reference (``judge``, block by block) and ends in one result per check (``results``)."""

    names: list[str]
    pending: list[PendingAgreement] = field(default_factory=list)

    def agreements(self) -> list[Agreement]:
        return [a for p in self.pending for a in p.agreements]

    def judge(self, output: str, block: slice | None, dim: int, bound: Any, mag: Any) -> None:
        """Show every bounded comparison of ``output`` one block of the main bound (and
        magnitudes, where the stored reference keeps them)."""
        for a in self.agreements():
            if a.output == output:
                a.add(block, dim, bound, mag)

    def results(self) -> list[PropertyResult]:
        return [p.finish(name) for name, p in zip(self.names, self.pending, strict=True)]


def run_properties(
    kernel: Any, case: Case, policy: Policy, device: torch.device, main: MainCall
) -> PropertyRun:
    """The property checks ``case.checks`` asks for that apply to its op, on the main call's
    inputs and outputs: their kernel calls now, their bounded comparisons while the main
    reference streams (``PropertyRun.judge``), their results at the end.

    Updates are already compared token by token against the whole-history forward, which is
    their chunk consistency; forward-only properties do not apply to them.
    """
    if case.op == "update" or not isinstance(main.inputs, ForwardInputs):
        return PropertyRun([])
    names = [c for c in case.checks if c != "packed_isolation" or case.seq_lens is not None]
    run = PropertyRun(names)
    for name in names:
        run.pending.append(run_property(name, kernel, case, policy, device, main))
    return run
