"""The reference in the form judging reads it, cached or not: per output, r in its stored
dtype and the bound rounded up to float32, and for the outputs a chunked call rounds once more
(``SLACK_OUTPUTS``) their magnitudes rounded up to bfloat16 (``footprint`` says why each is
exact enough).

``compact`` turns a computed block (float64 r and magnitudes) into a ``StoredBlock``;
``expand`` turns a stored block, computed now or read from an entry, into what the metrics
take (float64 r and bound). Every case is judged through both, so a verdict does not depend
on whether its reference came from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.dtypes import torch_dtype
from convmatrix.runners.case.bounds import bound_of, zero_floor
from convmatrix.runners.case.refcache.footprint import SLACK_OUTPUTS, stored_dtype
from convmatrix.runners.case.refcache.key import BoundSpec

__all__ = ["Expanded", "Span", "StoredBlock", "compact", "expand", "round_up"]

F64 = torch.float64
Span = tuple[int, int] | None  # a block's channels [start, stop); None: all of them


@dataclass
class StoredBlock:
    """One channel block of a case's reference as an entry stores it."""

    span: Span
    refs: dict[str, torch.Tensor] = field(default_factory=dict)  # r in ``stored_dtype``
    # bound - eta, rounded up to float32 (float64 where float32 would overflow)
    bounds: dict[str, torch.Tensor] = field(default_factory=dict)
    # the magnitudes (sum of |terms|) of ``SLACK_OUTPUTS``, rounded up to bfloat16
    mags: dict[str, torch.Tensor] = field(default_factory=dict)

    def parts(self) -> tuple[tuple[str, dict[str, torch.Tensor]], ...]:
        """The block's tensors by part, in the order an entry holds them."""
        return (("r", self.refs), ("bound", self.bounds), ("mag", self.mags))

    def cpu(self) -> StoredBlock:
        """The block on the host (what an entry is written from)."""
        return self.to(torch.device("cpu"), always=True)

    def to(self, device: torch.device | None, *, always: bool = False) -> StoredBlock:
        if not always and (device is None or device.type == "cpu"):
            return self
        moved = [{k: v.to(device) for k, v in held.items()} for _, held in self.parts()]
        return StoredBlock(self.span, *moved)


# What the metrics take of a block: r, the bound and the slack magnitudes, in float64.
Expanded = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def round_up(b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``dtype`` (float32 or bfloat16) values at least ``b`` (float64, >= 0), each the smallest
    such: a bound loosens by less than one unit in the last place of ``dtype`` (2^-23 relative
    for float32, 2^-7 for bfloat16) and never tightens. Float64 (unchanged) where ``dtype``
    would overflow to infinity: no real data comes near (3.4e38), and an infinite bound would
    pass anything."""
    out = b.to(dtype).contiguous()  # to nearest: at most one step below b
    # One step up where it fell below: for floats >= 0 the next value up is the next bit
    # pattern (0 -> the smallest subnormal, the largest finite -> inf). In place, no masks:
    # half the elements move, and indexing them cost 4x the rest of the bound's work.
    out.view(_BITS[dtype]).add_(torch.lt(out, b).to(_BITS[dtype]))
    if bool(torch.isinf(out).any()) and bool(torch.isfinite(b).all()):
        return b.contiguous().clone()
    return out


def compact(
    case: Case,
    span: Span,
    refs: dict[str, torch.Tensor],
    mags: dict[str, Magnitudes],
    spec: BoundSpec,
) -> StoredBlock:
    """A computed block (float64 r; magnitudes of the outputs that have a bound) in its
    stored form."""
    block = StoredBlock(span)
    for name, r in refs.items():
        if name in mags:
            bound = bound_of(r, mags[name], spec.contract, case, name, spec.policy)
            # >= 0: the bound is eta plus terms >= 0, each sum rounded to nearest (monotone)
            block.bounds[name] = round_up(bound.sub_(zero_floor(case, name)))
            if name in SLACK_OUTPUTS and mags[name].mag is not None:
                block.mags[name] = round_up(mags[name].mag.to(F64), torch.bfloat16)
        # contiguous, as an entry reads back: a reduction over a strided view (dx is one of
        # the extended gradient) sums in another order, and the rms moved in its last bit
        block.refs[name] = r.to(torch_dtype(stored_dtype(name, case))).contiguous()
    return block


def expand(case: Case, block: StoredBlock) -> Expanded:
    """(r, bound, slack magnitudes) of each output in float64, as the metrics and the property
    checks take them (the bound is eta again where it was 0: an element expected to be
    exactly 0)."""
    refs = {name: r.to(F64) for name, r in block.refs.items()}
    bounds = {
        name: b.to(F64, copy=True).add_(zero_floor(case, name)) for name, b in block.bounds.items()
    }
    return refs, bounds, {name: m.to(F64) for name, m in block.mags.items()}
