"""Property checks besides the numeric comparison (docs/spec.md §3), kernel against itself.

- guards: the storage around every view is still NaN, inputs hold their values, and an update
  touched no pool row that no slot names;
- causality: changing only future inputs ``x[t+1:]`` leaves ``y[:t+1]`` unchanged;
- packed isolation: changing every other packed sample leaves the samples between unchanged;
- chunk consistency: two chunks with the state carried across (and its gradient flowing back)
  equal one whole call, forward and backward.

Causality and packed isolation are exact: a deterministic forward's unaffected outputs do not
depend on the changed inputs at all, so they must not change by a single bit, however small
a leak; the largest difference is reported. A kernel that declares its forward
nondeterministic (``Capabilities.deterministic = False``) is held to the bound model instead.
Chunk consistency changes reduction orders, so it keeps a tolerance, derived from the same
bounds (docs/spec.md §4): each side may be ``safety`` bounds from the reference, so the two
may differ by twice that, element by element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.dtypes import UNIT_ROUNDOFF
from convmatrix.core.records import PropertyResult
from convmatrix.core.sanitise import safe_str
from convmatrix.core.tolerances import Policy
from convmatrix.core.verdict import judged_dtype
from convmatrix.kernels.oracle.reference import (
    backward_magnitudes,
    conv_forward,
    forward_magnitudes,
)
from convmatrix.runners.applicability import not_applicable, refused_call, split_point
from convmatrix.runners.bounds import bound_of, bound_usage
from convmatrix.runners.inputs import (
    ForwardInputs,
    UpdateInputs,
    build_forward,
    place,
    recording_placed,
)
from convmatrix.runners.invoke import KernelFault, call_forward, grads

__all__ = ["PROPERTIES", "check_guards", "run_properties", "run_property"]


def check_guards(
    inputs: ForwardInputs | UpdateInputs, contract: Capabilities | None = None
) -> PropertyResult:
    """Gaps still NaN, inputs unchanged, unnamed pool rows unchanged. An update that declares
    y written into x (``contract.inplace_y``) may change x's values, never its gaps."""
    update = isinstance(inputs, UpdateInputs)
    y_in_x = update and "update" in (contract or Capabilities()).inplace_y
    problems = [p for g in inputs.guarded() if (p := g.gap_damage())]
    for g in inputs.guarded():
        if update and g is inputs.pool:
            rows = [r for r in range(g.values.shape[0]) if r not in inputs.named_rows]
            problem = g.value_damage(rows) if rows else None
        elif y_in_x and any(g is x for x in inputs.xs):
            problem = None
        else:
            problem = g.value_damage()
        if problem:
            problems.append(problem)
    return PropertyResult("guards", not problems, "; ".join(problems))


def _largest(a: torch.Tensor, b: torch.Tensor) -> tuple[float, list[int]]:
    """(largest |a - b|, where): NaN where the other is not counts as infinite."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    diff = (a64 - b64).abs()
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    diff = torch.where(both_nan, 0.0, torch.nan_to_num(diff, nan=float("inf")))
    flat = int(torch.argmax(diff))
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)]
    return float(diff.reshape(-1)[flat]), where


def _identical(name: str, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None when ``a`` and ``b`` hold the same values (NaN where NaN), else the largest
    difference and where it is."""
    if a.numel() == 0:
        return None
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if bool(same.all()):
        return None
    diff, where = _largest(a, b)
    count = int((~same).sum())
    return (
        f"{name}: y differs in {count} element(s) (must be identical), "
        f"max|diff| {diff:.3g} at {where}"
    )


def _within(
    name: str, a: torch.Tensor, b: torch.Tensor, bound: torch.Tensor, policy: Policy, output: str
) -> str | None:
    """None when |a - b| <= 2 x safety x bound everywhere (each side within ``safety`` bounds
    of the reference), else the bound usage and the largest difference."""
    if a.numel() == 0:
        return None
    allowed = 2 * policy.safety
    usage = bound_usage(a, b.detach().cpu().double(), bound)
    if usage <= allowed:
        return None
    diff, where = _largest(a, b)
    return (
        f"{name}: {output} differs by {usage:.3g} bounds (allowed {allowed:.3g}), "
        f"max|diff| {diff:.3g} at {where}"
    )


def _reference(fi: ForwardInputs, case: Case, state: torch.Tensor | None, backward: bool):
    """Reference values and magnitudes of y, F (and the gradients) of ``fi`` with ``state``."""
    y, final, saved = conv_forward(
        fi.x.values,
        fi.weight.values,
        None if fi.bias is None else fi.bias.values,
        state,
        None if fi.seq_idx is None else fi.seq_idx.cpu(),
        case.activation,
        magnitudes=True,
    )
    values = {"y": y, "F": final}
    mags = {"y": forward_magnitudes(saved, y), "F": Magnitudes(None, 0)}
    if backward:
        assert fi.g is not None
        q = fi.q if fi.q is not None else torch.zeros(final.shape, dtype=torch.float64)
        (dx, dw, db, ds), grad_mags = backward_magnitudes(saved, fi.weight.values, fi.g, q)
        values.update(dx=dx, dw=dw, db=db, dS=ds)
        mags.update(grad_mags)
    return values, mags


def _unaffected(
    name: str,
    kernel: Any,
    case: Case,
    fi: ForwardInputs,
    policy: Policy,
    a: torch.Tensor,
    b: torch.Tensor,
    select: Callable[[torch.Tensor], torch.Tensor],
) -> str | None:
    """Outputs a change must not reach: identical for a deterministic kernel, else within
    the bounds of the reference (``select`` picks them from a full y)."""
    if kernel.capabilities.deterministic:
        return _identical(name, a, b)
    state = None if fi.initial_state is None else fi.initial_state.values
    values, mags = _reference(fi, case, state, False)
    bound = bound_of(values["y"], mags["y"], kernel.capabilities, case, "y", policy)
    return _within(name, a, b, select(bound), policy, "y")


def _forward(kernel: Any, case: Case, fi: ForwardInputs, x: torch.Tensor | None = None):
    return call_forward(
        kernel,
        case,
        fi.x.view if x is None else x,
        fi.weight.view,
        None if fi.bias is None else fi.bias.view,
        None if fi.initial_state is None else fi.initial_state.view,
        fi.seq_idx,
        False,
    )[0]


def _replace_x(case: Case, fi: ForwardInputs, mask: torch.Tensor, device) -> torch.Tensor:
    """A view (same layout/gap) of x whose tokens under ``mask`` (B, 1|C, L) are changed."""
    changed = torch.where(mask, 1.5 - 2.0 * fi.x.values.float(), fi.x.values.float())
    return place("x'", changed.to(fi.x.values.dtype), device, case.layout, case.gap).view


def causality(kernel: Any, case: Case, policy: Policy, device: torch.device) -> PropertyResult:
    fi = build_forward(case, device)
    length = fi.x.values.shape[2]
    cut = length // 2  # keep y[:cut+1], change x[cut+1:]
    with torch.no_grad():
        before = _forward(kernel, case, fi)
        future = torch.arange(length) > cut
        after = _forward(kernel, case, fi, _replace_x(case, fi, future[None, None, :], device))
    problem = _unaffected(
        f"changing x[{cut + 1}:]",
        kernel,
        case,
        fi,
        policy,
        after[..., : cut + 1],
        before[..., : cut + 1],
        lambda t: t[..., : cut + 1],
    )
    return PropertyResult("causality", problem is None, problem or f"y[:{cut + 1}] unchanged")


def packed_isolation(
    kernel: Any, case: Case, policy: Policy, device: torch.device
) -> PropertyResult:
    """Change the even-numbered samples (and the state, which belongs to sample 0); the
    odd-numbered samples' outputs must not move."""
    fi = build_forward(case, device)
    assert fi.seq_idx is not None
    ids = fi.seq_idx[0].cpu()
    changed = (ids >= 0) & (ids % 2 == 0)
    kept = (ids >= 0) & (ids % 2 == 1)
    if not bool(kept.any()):
        return PropertyResult("packed_isolation", True, "only one sample: nothing to isolate")
    with torch.no_grad():
        before = _forward(kernel, case, fi)
        after = _forward(kernel, case, fi, _replace_x(case, fi, changed[None, None, :], device))
    problem = _unaffected(
        "changing even samples",
        kernel,
        case,
        fi,
        policy,
        after[..., kept],
        before[..., kept],
        lambda t: t[..., kept],
    )
    return PropertyResult("packed_isolation", problem is None, problem or "odd samples unchanged")


def chunk_consistency(
    kernel: Any, case: Case, policy: Policy, device: torch.device
) -> PropertyResult:
    fi = build_forward(case, device)
    ids = None if fi.seq_idx is None else fi.seq_idx[0].cpu()
    s = split_point(case, ids, fi.x.values.shape[2])
    if s is None:
        return not_applicable("chunk_consistency", "no split inside a sample")
    backward = case.op == "fwd_bwd"
    state = (
        fi.initial_state.view
        if fi.initial_state is not None
        else torch.zeros(
            fi.x.values.shape[0],
            fi.x.values.shape[1],
            case.width - 1,
            dtype=fi.x.values.dtype,
            device=device,
        )
    )
    params = {"dx": fi.x.view, "dw": fi.weight.view, "dS": state}
    if fi.bias is not None:
        params["db"] = fi.bias.view
    for p in params.values():
        p.requires_grad_(backward)
    bias = None if fi.bias is None else fi.bias.view
    seq = fi.seq_idx

    def fwd(x, init, sidx):
        return call_forward(kernel, case, x, fi.weight.view, bias, init, sidx, True)

    with torch.set_grad_enabled(backward):
        whole = fwd(fi.x.view, state, seq)
        y1, f1 = fwd(fi.x.view[..., :s], state, None if seq is None else seq[:, :s])
        y2, f2 = fwd(fi.x.view[..., s:], f1, None if seq is None else seq[:, s:])
        chunked = (torch.cat([y1, y2], dim=2), f2)
    label = f"chunks {s}+{fi.x.values.shape[2] - s}"
    state_values = state.detach().cpu() if fi.initial_state is None else fi.initial_state.values
    values, mags = _reference(fi, case, state_values, backward)

    def compare(name: str, c: torch.Tensor, w: torch.Tensor) -> str | None:
        bound = bound_of(values[name], mags[name], kernel.capabilities, case, name, policy)
        if mags[name].mag is not None:
            # The chunked side stores each chunk's partial result (dw, db: one per call) and
            # the state's gradient between the calls: one more rounding of every term, in
            # the output's and in x's dtype.
            u = UNIT_ROUNDOFF[judged_dtype(name, case)] + UNIT_ROUNDOFF[case.x_dtype]
            bound = bound + u * mags[name].mag
        return _within(label, c.detach(), w.detach(), bound, policy, name)

    problems = [compare(name, c, w) for name, c, w in zip(("y", "F"), chunked, whole, strict=True)]
    if backward:
        q = fi.q if fi.q is not None else torch.zeros(state.shape, dtype=state.dtype)
        g_whole = grads(list(whole), [fi.g, q], params)
        g_chunk = grads(list(chunked), [fi.g, q], params)
        problems += [compare(k, g_chunk[k], g_whole[k]) for k in params]
    bad = [p for p in problems if p]
    return PropertyResult("chunk_consistency", not bad, "; ".join(bad) or f"split at {s} agrees")


PROPERTIES: dict[str, Callable[[Any, Case, Policy, torch.device], PropertyResult]] = {
    "causality": causality,
    "packed_isolation": packed_isolation,
    "chunk_consistency": chunk_consistency,
}


def run_property(
    name: str, kernel: Any, case: Case, policy: Policy, device: torch.device
) -> PropertyResult:
    """One check, only if the kernel's contract accepts every call it makes (else not
    applicable, with the reason); a kernel that raises fails this check alone, by name."""
    refused = refused_call(kernel, name, case)
    if refused:
        return not_applicable(name, refused)
    with recording_placed() as placed:
        try:
            result = PROPERTIES[name](kernel, case, policy, device)
        except KernelFault as exc:
            result = PropertyResult(name, False, safe_str(exc))
    # The check's own calls are held to the guards too: a write outside a view (or into an
    # input) made only on these calls went unseen when only the main call was guarded.
    damage = [p for g in placed for p in (g.gap_damage(), g.value_damage()) if p]
    if damage:
        detail = f"guards broken by this check's calls: {'; '.join(damage)}"
        return PropertyResult(
            name, False, f"{detail}; {result.detail}" if result.detail else detail
        )
    return result


def run_properties(
    kernel: Any, case: Case, policy: Policy, device: torch.device
) -> list[PropertyResult]:
    """The property checks ``case.checks`` asks for that apply to its op, each recorded.

    Updates are already compared token by token against the whole-history forward, which is
    their chunk consistency; forward-only properties do not apply to them.
    """
    if case.op == "update":
        return []
    checks = [c for c in case.checks if c != "packed_isolation" or case.seq_lens is not None]
    return [run_property(name, kernel, case, policy, device) for name in checks]
