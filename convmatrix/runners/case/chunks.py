"""Chunk consistency: the case's row in two calls, the state carried across, against the
case's own whole call (docs/spec.md §3).

The first chunk starts from the case's initial state (zeros when it has none: the same
values, and the state's path of a kernel on a short first chunk is exercised too), the
second from the first chunk's final state; for ``fwd_bwd`` the gradients flow back through
both chunks (the kernel's backward once per chunk). Each output is compared with the main
call's output of the same name within the main verdict's bounds (``runners.case.agreement``),
plus one unit roundoff per term for the partial results the chunks store.

Two outputs the main call may lack are judged on their own: the final state against its
exact value (a copy of the last K-1 inputs, docs/spec.md §2), and the initial state's
gradient against a reference of the first K-1 tokens only (dS depends on nothing later):
a few columns, not a second whole-tensor reference.
"""

from __future__ import annotations

from typing import Any

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.dtypes import UNIT_ROUNDOFF
from convmatrix.core.tolerances import Policy
from convmatrix.core.verdict import judged_dtype
from convmatrix.kernels.oracle.steps import final_state_reference, state_grad_reference
from convmatrix.runners.case.agreement import Agreement, MainCall, PendingAgreement, largest_diff
from convmatrix.runners.case.applicability import not_applicable, split_point
from convmatrix.runners.case.bounds import bound_of, bound_usage
from convmatrix.runners.case.invoke import call_forward, grads
from convmatrix.runners.case.refcache.footprint import SLACK_OUTPUTS

__all__ = ["chunk_consistency"]

NAME = "chunk_consistency"

Chunked = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # one output, or each chunk's


def _chunked(kernel: Any, case: Case, main: MainCall, s: int) -> dict[str, Chunked]:
    """The outputs of the two chunks split at ``s``: y (each chunk's), F (the second's final
    state) and, for ``fwd_bwd``, the gradients of the main call's parameters (dx: each
    chunk's). A chunk's y and dx are judged where they lie in the main ones: joining them
    was a copy of each (bf16 C=3072 L=4096: 0.1x the packed case's kernel phase)."""
    fi = main.inputs
    backward = case.op == "fwd_bwd"
    batch, dim, _ = fi.x.values.shape
    state = (
        torch.zeros(batch, dim, case.width - 1, dtype=fi.x.values.dtype, device=fi.x.view.device)
        if fi.initial_state is None
        else fi.initial_state.view
    )
    # Each chunk's x is a leaf of its own (the same storage, strides and guards as the
    # whole x's view): through the whole x, autograd gave each chunk's dx a zero-filled
    # whole-length gradient and added the two, 0.15x of a case's kernel phase (f32).
    xs = [fi.x.view[..., :s].detach(), fi.x.view[..., s:].detach()]
    params = {"dx1": xs[0], "dx2": xs[1], "dw": fi.weight.view, "dS": state}
    if fi.bias is not None:
        params["db"] = fi.bias.view
    for p in params.values():
        p.requires_grad_(backward)
    bias, seq = (None if fi.bias is None else fi.bias.view), fi.seq_idx

    def fwd(x: torch.Tensor, init: torch.Tensor | None, sidx: torch.Tensor | None) -> Any:
        main.calls.forward += 1
        return call_forward(kernel, case, x, fi.weight.view, bias, init, sidx, True)

    with torch.set_grad_enabled(backward):
        y1, f1 = fwd(xs[0], state, None if seq is None else seq[:, :s])
        y2, f2 = fwd(xs[1], f1, None if seq is None else seq[:, s:])
    out = {"y": (y1.detach(), y2.detach()), "F": f2.detach()}
    if backward:
        main.calls.backward += 2
        g = [None, None] if fi.g is None else [fi.g[..., :s], fi.g[..., s:]]
        # Each chunk's y gets its slice of the upstream gradient, a view with the strides
        # the whole call's dy has (the layout a kernel receives is part of the case).
        got = grads([y1, y2, f2], [*g, fi.q], params)
        out["dx"] = (got.pop("dx1").detach(), got.pop("dx2").detach())
        out.update({k: v.detach() for k, v in got.items()})
    return out


def _against_reference(
    kernel: Any, case: Case, policy: Policy, name: str, got: torch.Tensor, label: str,
    reference: tuple[torch.Tensor, Magnitudes],
) -> str | None:  # fmt: skip
    """An output the main call lacks, against its own small reference, within the same
    2 x safety bounds (plus the chunks' extra rounding) as the outputs it has."""
    r, mags = reference
    bound = bound_of(r, mags, kernel.capabilities, case, name, policy)
    if mags.mag is not None:
        bound = bound + _extra_rounding(case, name) * mags.mag
    usage = bound_usage(got, r, bound)
    if usage <= 2 * policy.safety:
        return None
    diff, where = largest_diff(got, r)
    return (
        f"{label}: {name} differs from its reference by {usage:.3g} bounds "
        f"(allowed {2 * policy.safety:.3g}), max|diff| {diff:.3g} at {where}"
    )


def _extra_rounding(case: Case, name: str) -> float:
    """The chunked side stores each chunk's partial result (dw, db: one per call) and the
    state's gradient between the calls: one more rounding of every term, in the output's
    and in x's dtype. Not y: the second chunk's state holds the inputs themselves, so its
    terms are the whole call's (the stored reference keeps magnitudes of the others only:
    ``refcache.footprint.SLACK_OUTPUTS``)."""
    if name not in SLACK_OUTPUTS:
        return 0.0
    return UNIT_ROUNDOFF[judged_dtype(name, case)] + UNIT_ROUNDOFF[case.x_dtype]


_OWN_REFERENCE = {"F": final_state_reference, "dS": state_grad_reference}


def chunk_consistency(
    kernel: Any, case: Case, policy: Policy, device: torch.device, main: MainCall
) -> PendingAgreement:
    fi = main.inputs
    length = fi.x.values.shape[2]
    s = split_point(case, None if fi.seq_idx is None else fi.seq_idx[0].cpu(), length)
    if s is None:
        return PendingAgreement(main.calls, result=not_applicable(NAME, "no split inside a sample"))
    chunked = _chunked(kernel, case, main, s)
    spans = [(0, s), (s, length)]
    label = f"chunks {s}+{length - s}"
    pending = PendingAgreement(main.calls, f"split at {s} agrees")
    for name, got in chunked.items():
        if name in main.outputs:
            allowed, slack = 2 * policy.safety, _extra_rounding(case, name)
            parts = [(got, None)] if isinstance(got, torch.Tensor) else zip(got, spans, strict=True)
            pending.agreements += [
                Agreement(label, name, part, main.outputs[name], allowed, slack, span=span)
                for part, span in parts
            ]
            continue
        assert isinstance(got, torch.Tensor)
        reference = _OWN_REFERENCE[name](case, fi)
        if problem := _against_reference(kernel, case, policy, name, got, label, reference):
            pending.problems.append(problem)
    return pending
