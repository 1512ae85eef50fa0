"""The guards around a case's tensors, checked after every kernel call: the storage around
each view still NaN, every input still holding its values (``runners.case.inputs.Guarded``).

A case checks them after its main call and again after each property check's calls (on what
the check placed and on the main call's inputs, which the checks reuse), so a large case
passes them several times: ``intact`` answers the common case, nothing touched, in one
comparison of the view's bits and a look at the gaps' elements alone; the element-by-element
account (``Guarded.gap_damage``, ``value_damage``) runs only when something was.
"""

from __future__ import annotations

import dataclasses

import torch

from convmatrix.core.contract import Capabilities
from convmatrix.core.records import PropertyResult
from convmatrix.runners.case.inputs import ForwardInputs, Guarded, UpdateInputs

__all__ = [
    "check_guards",
    "damage",
    "fresh_copy",
    "intact",
    "keep_pristine",
    "restore",
    "runs",
    "same_bits",
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (an answer of False may still be equal
    values: -0.0 and 0.0, NaNs). Laid out alike, they are compared in memory order as the
    widest integers their rows allow: a guarded storage, a time span of a channel-last
    output (dense) or of a channel-first one (rows): 2.5-4x faster than ``torch.equal``
    on 2-byte elements through the logical strides."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() and a.stride() == b.stride():
        order = sorted(range(a.dim()), key=lambda d: -a.stride(d))
        pa, pb = a.permute(order), b.permute(order)
        if pa.is_contiguous() and pb.is_contiguous():
            pa, pb = pa.reshape(-1), pb.reshape(-1)
        if pa.stride(-1) == 1:
            for word in (torch.int64, torch.int32, torch.int16):
                try:
                    wa, wb = pa.view(torch.uint8).view(word), pb.view(torch.uint8).view(word)
                except RuntimeError:  # rows, offset or strides not a whole number of words
                    continue
                return torch.equal(wa, wb)
    return torch.equal(a, b)


def intact(g: Guarded) -> bool:
    """Whether the storage is bit for bit as ``place`` left it (``Guarded.pristine``): then
    the view holds its values and every element outside it is NaN. (A gap holding another
    NaN is not intact here, yet no damage: ``damage`` asks the element-by-element checks.)"""
    return same_bits(g.base.detach(), g.pristine())


def keep_pristine(inputs: ForwardInputs | UpdateInputs) -> None:
    """Snapshot every guarded tensor of a case before its first kernel call."""
    for g in inputs.guarded():
        g.keep_pristine()


def damage(guarded: list[Guarded]) -> list[str]:
    """What a call broke: gaps written, values changed (empty when every tensor is intact)."""
    return [p for g in guarded if not intact(g) for p in (g.gap_damage(), g.value_damage()) if p]


def check_guards(
    inputs: ForwardInputs | UpdateInputs, contract: Capabilities | None = None
) -> PropertyResult:
    """Gaps still NaN, inputs unchanged, unnamed pool rows unchanged. An update that declares
    y written into x (``contract.inplace_y``) may change x's values, never its gaps."""
    if isinstance(inputs, ForwardInputs):
        problems = damage(inputs.guarded())
        return PropertyResult("guards", not problems, "; ".join(problems), 0, 0)
    y_in_x = "update" in (contract or Capabilities()).inplace_y
    problems = [p for g in inputs.guarded() if (p := g.gap_damage())]
    for g in inputs.guarded():
        if g is inputs.pool:
            rows = [r for r in range(g.values.shape[0]) if r not in inputs.named_rows]
            problem = g.value_damage(rows) if rows else None
        elif y_in_x and any(g is x for x in inputs.xs):
            problem = None
        else:
            problem = g.value_damage()
        if problem:
            problems.append(problem)
    return PropertyResult("guards", not problems, "; ".join(problems), 0, 0)


def restore(guarded: list[Guarded]) -> None:
    """Put back the NaN gaps and the values a kernel's call broke, so the next call (the
    next property check) starts from the inputs the case drew."""
    with torch.no_grad():
        for g in guarded:
            g.base.detach().copy_(g.pristine())


def runs(mask: torch.Tensor) -> list[slice]:
    """The runs of True in a 1-D mask, as slices (a packed row's samples are runs)."""
    edges = torch.diff(mask.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8),
                       append=torch.zeros(1, dtype=torch.int8))  # fmt: skip
    starts, stops = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
    return [slice(int(a), int(b)) for a, b in zip(starts, stops, strict=True)]


def fresh_copy(inputs: ForwardInputs) -> ForwardInputs:
    """The case's inputs as they were placed, in new storage (contiguous copies of each
    tensor's pristine storage): what another kernel (the torch path) runs on, drawn once.
    Drawing them again cost as much as the case's own inputs phase (``torch.randn``)."""

    def copy(g: Guarded | None) -> Guarded | None:
        if g is None:
            return None
        base, v = g.pristine().clone(), g.view
        view = base.as_strided(v.shape, v.stride(), v.storage_offset()).detach()
        return Guarded(g.name, base, view, g.covered, g.values, g.pristine())

    x, weight = copy(inputs.x), copy(inputs.weight)
    assert x is not None and weight is not None
    return dataclasses.replace(
        inputs, x=x, weight=weight, bias=copy(inputs.bias),
        initial_state=copy(inputs.initial_state),
    )  # fmt: skip
