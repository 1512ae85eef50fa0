"""The reference in the form judging reads it, cached or not: per output, r in its stored
form (``footprint.R_FORMS``: float64; split into float32 and an int8 remainder; or float32),
the bound widened by what that form moves r and rounded up to bfloat16, and for the outputs
a chunked call rounds once more (``SLACK_OUTPUTS``) their magnitudes rounded up to bfloat16
(``footprint`` says why each is exact enough).

``compact`` turns a computed block (float64 r and magnitudes) into a ``StoredBlock`` (and
what judging reads from it);
``expand`` turns a stored block, computed now or read from an entry, into what the metrics
take (float64 r and bound). Every case is judged through both, so a verdict does not depend
on whether its reference came from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.runners.case.bounds import bound_of, zero_floor
from convmatrix.runners.case.refcache.footprint import SLACK_OUTPUTS, r_form
from convmatrix.runners.case.refcache.key import BoundSpec

__all__ = ["Expanded", "Span", "StoredBlock", "compact", "expand", "round_up"]

F64 = torch.float64
Span = tuple[int, int] | None  # a block's channels [start, stop); None: all of them


@dataclass
class StoredBlock:
    """One channel block of a case's reference as an entry stores it."""

    span: Span
    refs: dict[str, torch.Tensor] = field(default_factory=dict)  # r, or its float32 part
    lows: dict[str, torch.Tensor] = field(default_factory=dict)  # the rest, int8 (``split``)
    # bound - eta + |r - r'|, rounded up to bfloat16 (float64 where it would overflow)
    bounds: dict[str, torch.Tensor] = field(default_factory=dict)
    # the magnitudes (sum of |terms|) of ``SLACK_OUTPUTS``, rounded up to bfloat16
    mags: dict[str, torch.Tensor] = field(default_factory=dict)

    def parts(self) -> tuple[tuple[str, dict[str, torch.Tensor]], ...]:
        """The block's tensors by part, in the order an entry holds them."""
        return (("r", self.refs), ("lo", self.lows), ("bound", self.bounds), ("mag", self.mags))

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
_INF_BITS = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80}  # +inf; NaN lies above
BOUND = torch.bfloat16  # what a bound is stored in (``footprint.BOUND_BYTES``)


def round_up(b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``dtype`` (float32 or bfloat16) values at least ``b`` (float64, >= 0), each the smallest
    such: a bound loosens by less than one unit in the last place of ``dtype`` (2^-23 relative
    for float32, 2^-7 for bfloat16) and never tightens. Float64 (unchanged) where ``dtype``
    would overflow to infinity: no real data comes near (3.4e38), and an infinite bound would
    pass anything."""
    out = b.to(dtype).contiguous()  # to nearest: at most one step below b
    bits = out.view(_BITS[dtype])
    # One step up where it fell below: for floats >= 0 the next value up is the next bit
    # pattern (0 -> the smallest subnormal, the largest finite -> inf). In place, no masks:
    # half the elements move, and indexing them cost 4x the rest of the bound's work. Both
    # sides of the compare in float64 and the overflow found from the bits: a compare of
    # mixed dtypes and ``isinf`` on bfloat16 take torch's slow per-element paths (together
    # 1.9x this function's time).
    bits.add_(torch.lt(out.to(F64), b))
    if int(bits.max()) >= _INF_BITS[dtype] and bool(torch.isfinite(b).all()):
        return b.contiguous().clone()
    return out


def compact(
    case: Case,
    span: Span,
    refs: dict[str, torch.Tensor],
    mags: dict[str, Magnitudes],
    spec: BoundSpec,
) -> tuple[StoredBlock, Expanded]:
    """A computed block (float64 r; magnitudes of the outputs that have a bound) in its
    stored form, and what judging reads from it (``expand`` of it, with each r' rebuilt once:
    the bound needs it too)."""
    block, rebuilt = StoredBlock(span), {}
    for name, r in refs.items():
        # contiguous, as an entry reads back: a reduction over a strided view (dx is one of
        # the extended gradient) sums in another order, and the rms moved in its last bit
        r = r.to(F64).contiguous()
        form = r_form(name, case)
        if form == "float64":
            block.refs[name] = rebuilt[name] = r  # r' is r
        else:
            hi = block.refs[name] = r.to(torch.float32)
            rebuilt[name] = hi.to(F64)
            if form == "split":
                block.lows[name] = _remainder(r, rebuilt[name])
                _add_remainder(rebuilt[name], block.lows[name])
        if name not in mags:
            continue
        # >= 0: the bound is eta plus terms >= 0, each sum rounded to nearest (monotone)
        bound = bound_of(r, mags[name], spec.contract, case, name, spec.policy)
        bound.sub_(zero_floor(case, name))
        if form != "float64":
            bound.add_(rebuilt[name].sub(r).abs_())  # |r - r'|
        block.bounds[name] = round_up(bound, BOUND)
        if name in SLACK_OUTPUTS and mags[name].mag is not None:
            block.mags[name] = round_up(mags[name].mag.to(F64), torch.bfloat16)
    return block, expand(case, block, rebuilt)


# The int8 remainder of a split r counts units of 2^-31 |hi|: |r - hi| <= 2^-24 |hi| is at
# most 128 of them (127 kept), so r' = hi + lo 2^-31 hi is within about 2^-32 |r| of r.
_LO_UNIT, _LO_MAX = 2.0**-31, 127


def _remainder(r: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """(r - hi) / hi in units of ``_LO_UNIT``, rounded, as int8 (0 where hi is 0: r' is then
    0, and the bound takes |r|, as it takes whatever r' misses). ``hi``: the float32 part, in
    float64 (float64 against float32 is torch's slow mixed-dtype path)."""
    units = r.sub(hi).div_(hi).mul_(1 / _LO_UNIT).round_()
    return units.nan_to_num_(0.0).clamp_(-_LO_MAX, _LO_MAX).to(torch.int8)


def _add_remainder(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """r' = hi + lo 2^-31 hi, in place in ``hi`` (float64): no fresh pages."""
    return hi.addcmul_(hi, lo.to(F64), value=_LO_UNIT)


def _rebuilt(block: StoredBlock, name: str) -> torch.Tensor:
    """r' of ``name`` in float64, a fresh tensor: what every case is judged against."""
    r = block.refs[name].to(F64, copy=True)
    if name not in block.lows:
        return r
    return _add_remainder(r, block.lows[name])


def expand(
    case: Case, block: StoredBlock, rebuilt: dict[str, torch.Tensor] | None = None
) -> Expanded:
    """(r, bound, slack magnitudes) of each output in float64, as the metrics and the property
    checks take them (the bound is eta again where it was 0: an element expected to be
    exactly 0). ``rebuilt``: r' of the outputs already rebuilt (``compact``)."""
    given = rebuilt or {}
    refs = {name: given[name] if name in given else _rebuilt(block, name) for name in block.refs}
    bounds = {
        name: b.to(F64, copy=True).add_(zero_floor(case, name)) for name, b in block.bounds.items()
    }
    return refs, bounds, {name: m.to(F64) for name, m in block.mags.items()}
