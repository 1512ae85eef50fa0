"""Turning a case into tensors: deterministic values, real strided views, NaN guards.

Every tensor of a case is drawn from a ``torch.Generator`` seeded from the case id, on the CPU,
so the same case gets the same data on every machine. Values are rounded to the case's dtypes
first; the float64 reference is computed from exactly those rounded values (``Guarded.values``),
so what remains in an error is the kernel's own arithmetic.

Layouts and gapped views are real views of a larger buffer (docs/spec.md §3, strides from
``convmatrix.core.layout``), never ``.contiguous()`` copies: ``channel_last`` is ``(B, L, C)``
storage transposed, ``channel_slice`` a slice of a wider channel dimension (Mamba2's in_proj
split), ``row_pad`` padded innermost rows, ``batch_pad`` a padded batch stride. Every buffer
also has a guard band before and after the view. All storage the view does not cover is NaN;
after the call it must still be NaN (else the kernel wrote out of bounds) and the view must hold
its values (inputs are not modified). Gap sizes are multiples of 8 elements so the views stay
legal for vectorised kernels.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.dtypes import torch_dtype
from convmatrix.core.layout import GUARD, storage_layout
from convmatrix.runners.case.transposed import copy_into

__all__ = [
    "ForwardInputs",
    "Guarded",
    "UpdateInputs",
    "build_forward",
    "build_update",
    "case_seed",
    "place",
    "recording_placed",
    "seq_idx_for",
]

_STREAMS = ("x", "weight", "bias", "state", "g", "q", "pool", "cache", "slots")


def case_seed(case: Case, stream: str) -> int:
    """Seed of one named tensor of a case: the case id plus a fixed per-name offset.

    Separate streams keep a tensor's values independent of which other tensors a case draws.
    """
    return (int(case.id, 16) + (_STREAMS.index(stream) + 1) * 0x9E3779B97F4A7C15) % 2**63


def _gen(case: Case, stream: str) -> torch.Generator:
    return torch.Generator().manual_seed(case_seed(case, stream))


def _randn(case: Case, stream: str, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(case, stream), dtype=torch.float32) * scale


@dataclass
class Guarded:
    """A strided view handed to a kernel, the NaN-filled buffer behind it, and its values.

    ``view`` has the logical shape; ``base`` is the 1-D storage; ``covered`` marks the elements
    of ``base`` the view owns; ``values`` (CPU, in the buffer's dtype) is what the view held
    before the call.
    """

    name: str
    base: torch.Tensor
    view: torch.Tensor
    covered: torch.Tensor
    values: torch.Tensor
    snapshot: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def keep_pristine(self) -> None:
        """Copy the storage now, before any kernel sees it: one contiguous copy, where
        rebuilding it later goes through the view's strides (a transposed copy for a
        channel-last view)."""
        self.snapshot = self.base.detach().clone()

    def pristine(self) -> torch.Tensor:
        """``base`` as ``place`` left it (NaN outside the view, the values inside): the
        guards are checked after every call of a case's property checks too, and comparing
        two contiguous buffers is the cheapest check there is."""
        if self.snapshot is None:
            base = torch.full_like(self.base, math.nan)
            v = self.view
            base.as_strided(v.shape, v.stride(), v.storage_offset()).copy_(self.values)
            self.snapshot = base
        return self.snapshot

    def gap_damage(self) -> str | None:
        """Why the storage outside the view is no longer all NaN, or None."""
        outside = self.base.detach().cpu()[~self.covered]
        bad = torch.nonzero(~torch.isnan(outside.float())).flatten()
        if bad.numel() == 0:
            return None
        where = torch.nonzero(~self.covered).flatten()[bad]
        return (
            f"{self.name}: {bad.numel()} element(s) outside the view were written "
            f"(storage offsets {where[:4].tolist()}, view offset {self.view.storage_offset()}, "
            f"shape {tuple(self.view.shape)}, strides {self.view.stride()})"
        )

    def value_damage(self, rows: list[int] | None = None) -> str | None:
        """Why the view no longer holds its values (optionally only the given leading rows)."""
        now = self.view.detach().cpu()
        before = self.values
        if rows is not None:
            now, before = now[rows], before[rows]
        changed = _bits(now) != _bits(before)
        if not bool(changed.any()):
            return None
        first = torch.nonzero(changed)[0].tolist()
        what = self.name if rows is None else f"{self.name} rows {rows}"
        return f"{what}: {int(changed.sum())} element(s) modified (first at {first})"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor as same-width integers: NaN-safe, -0.0 != 0.0."""
    if not t.dtype.is_floating_point:
        return t
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


_recording: list[list[Guarded]] = []  # open ``recording_placed`` blocks, innermost last


@contextmanager
def recording_placed() -> Iterator[list[Guarded]]:
    """Every ``Guarded`` tensor ``place`` makes inside the block, in a list: what a property
    check built for its own calls, so its guards are checked after them too."""
    placed: list[Guarded] = []
    _recording.append(placed)
    try:
        yield placed
    finally:
        _recording.remove(placed)


def place(
    name: str,
    values: torch.Tensor,
    device: torch.device,
    layout: str = "channel_first",
    gap: str | None = None,
) -> Guarded:
    """Put ``values`` (already rounded, CPU) into a NaN-filled buffer as a strided view.

    3-D values take ``layout``/``gap``; other ranks are laid out contiguously. Either way the
    view sits between two guard bands.
    """
    values = values.detach().cpu().contiguous()
    if values.dim() == 3:
        strides, offset, size = storage_layout(tuple(values.shape), layout, gap)
    else:
        strides = values.stride()
        offset, size = GUARD, GUARD + values.numel() + GUARD
    base = torch.full((size,), math.nan, dtype=values.dtype, device=device)
    view = base.as_strided(values.shape, strides, offset)
    copy_into(view, values)
    covered = torch.zeros(size, dtype=torch.bool)
    covered.as_strided(values.shape, strides, offset).fill_(True)
    # A fresh leaf over the same memory, so a kernel's backward can treat it as a parameter.
    leaf = base.as_strided(values.shape, strides, offset).detach()
    guarded = Guarded(name, base, leaf, covered, values)
    if _recording:
        _recording[-1].append(guarded)
    return guarded


def seq_idx_for(seq_lens: tuple[int, ...], batch: int) -> torch.Tensor:
    """(B, L) int32 sequence ids: segment i gets id i; a negative length -n is n padding (-1).

    Every row carries the same packing, so boundaries fall at the same tokens in each row.
    """
    ids: list[int] = []
    number = 0
    for n in seq_lens:
        if n < 0:
            ids += [-1] * (-n)
        else:
            ids += [number] * n
            number += 1
    return torch.tensor(ids, dtype=torch.int32).expand(batch, len(ids)).contiguous()


@dataclass
class ForwardInputs:
    """Tensors of a ``fwd`` / ``fwd_bwd`` case. ``g``/``q`` only for backward (CPU, rounded)."""

    x: Guarded
    weight: Guarded
    bias: Guarded | None
    initial_state: Guarded | None
    seq_idx: torch.Tensor | None
    g: torch.Tensor | None
    q: torch.Tensor | None
    # dy as handed to the kernel when ``case.grad_layout`` asks for a non-dense one (on the
    # device; a gapped view has NaN gaps); None: ``g`` itself (dense).
    g_view: torch.Tensor | None = None

    def guarded(self) -> list[Guarded]:
        return [t for t in (self.x, self.weight, self.bias, self.initial_state) if t is not None]


def _params(case: Case, device: torch.device) -> tuple[Guarded, Guarded | None]:
    """Weight ~ N(0, 1/K) and bias ~ N(0, 1/4): zero-mean pre-activations, so SiLU inputs
    straddle zero; both rounded to the weight dtype."""
    wdt = torch_dtype(case.w_dtype)
    weight = _randn(case, "weight", (case.dim, case.width), 1 / math.sqrt(case.width))
    wg = place("weight", weight.to(wdt), device)
    if not case.bias:
        return wg, None
    return wg, place("bias", _randn(case, "bias", (case.dim,), 0.5).to(wdt), device)


def build_forward(case: Case, device: torch.device | str = "cpu") -> ForwardInputs:
    """x, weight, bias, initial state, seq_idx, and for ``fwd_bwd`` g = dL/dy and q = dL/dF."""
    device = torch.device(device)
    xdt = torch_dtype(case.x_dtype)
    assert case.seqlen is not None, "forward cases have a seqlen"
    shape = (case.batch, case.dim, case.seqlen)
    x = place("x", _randn(case, "x", shape).to(xdt), device, case.layout, case.gap)
    weight, bias = _params(case, device)
    state = None
    state_shape = (case.batch, case.dim, case.width - 1)
    if case.initial_state == "random":
        state = _randn(case, "state", state_shape)
    elif case.initial_state == "zeros":
        state = torch.zeros(state_shape)
    # Dao's channel-last kernels want the state in the same layout as x.
    init = None if state is None else place("initial_state", state.to(xdt), device, case.layout)
    seq_idx = None if case.seq_lens is None else seq_idx_for(case.seq_lens, case.batch).to(device)
    g = q = g_view = None
    if case.op == "fwd_bwd":
        g = _randn(case, "g", shape).to(xdt)
        if case.grad_layout == "expanded":  # y.sum().backward(): one value, all strides 0
            g = g[:1, :1, :1].expand(shape)
            g_view = g[:1, :1, :1].to(device).expand(shape)
        elif case.grad_layout == "gapped":
            # a fused projection's gradient split along channels, token-major (B, L, 3C)
            g_view = place("g", g, device, "channel_last", "channel_slice").view
        if case.final_state:
            q = _randn(case, "q", state_shape).to(xdt)
            if case.dfinal != "random":
                q = torch.zeros_like(q)
    return ForwardInputs(x, weight, bias, init, seq_idx, g, q, g_view)


@dataclass
class UpdateInputs:
    """Tensors of an ``update`` case: ``steps`` calls of ``tokens`` new tokens each.

    ``pool`` (P, C, S) is the state pool, written in place; ``slots`` the state_indices as the
    kernel takes them (or None), its padding rows marked ``pad_slot_id``; ``cache_seqlens``
    one (B,) tensor per step (ring buffer) or None. ``named_rows`` are the pool rows some live
    slot names; every other row must be left untouched.
    """

    pool: Guarded
    xs: list[Guarded]
    weight: Guarded
    bias: Guarded | None
    slots: torch.Tensor | None
    cache_seqlens: list[torch.Tensor] | None
    named_rows: list[int]
    pad_slot_id: int = -1

    def guarded(self) -> list[Guarded]:
        extra = [self.bias] if self.bias is not None else []
        return [self.pool, *self.xs, self.weight, *extra]

    def canonical_slots(self) -> torch.Tensor | None:
        """``slots`` in docs/spec.md §2's convention (padding rows -1), for the reference."""
        if self.slots is None or self.pad_slot_id < 0:
            return self.slots
        return torch.where(self.slots == self.pad_slot_id, -1, self.slots)


def _slots(case: Case, contract: Capabilities) -> tuple[int, torch.Tensor | None]:
    """(pool rows, state_indices). Pools are larger than the batch when slots are mapped, so
    some rows belong to no slot; ``permuted_pad`` marks odd rows (row 0 when B=1) as pad -1.
    ``identity`` hands a kernel without slot support no state_indices and a pool of B rows."""
    if not case.slots:
        return case.batch, None
    if case.slots == "identity":
        if "slot_indices" not in contract.features:
            return case.batch, None
        return case.batch + 1, torch.arange(case.batch, dtype=torch.int32)
    pool = case.batch + 2
    perm = torch.randperm(pool, generator=_gen(case, "slots"))[: case.batch].to(torch.int32)
    if case.slots == "permuted_pad":
        pads = [0] if case.batch == 1 else list(range(1, case.batch, 2))
        perm[pads] = -1
    return pool, perm


def _reserve_row(
    pool: torch.Tensor, slots: torch.Tensor, pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Make pool row ``pad`` (>= 0, e.g. vLLM's null block 0) a row no live slot names, and
    mark padding slots with it: rows from ``pad`` on move down one, a zero row takes its place
    (the guards then check the kernel leaves it alone)."""
    rows = torch.arange(pool.shape[0])
    moved = rows + (rows >= pad)
    new = pool.new_zeros((max(pool.shape[0], pad) + 1, *pool.shape[1:]))
    new[moved] = pool
    live = slots >= 0
    return new, torch.where(live, slots + (slots >= pad).to(slots.dtype), pad).to(slots.dtype)


def build_update(
    case: Case, device: torch.device | str = "cpu", contract: Capabilities | None = None
) -> UpdateInputs:
    """A random state pool (the history), the new tokens of every step, slots and seqlens,
    as ``contract`` (the kernel's; default: docs/spec.md §2's) takes slots."""
    device = torch.device(device)
    contract = contract or Capabilities()
    xdt = torch_dtype(case.x_dtype)
    assert case.tokens is not None and case.steps is not None and case.state_len is not None
    rows, slots = _slots(case, contract)
    pool_values = _randn(case, "pool", (rows, case.dim, case.state_len)).to(xdt)
    pad = contract.pad_slot_id
    if slots is not None and pad >= 0:
        pool_values, slots = _reserve_row(pool_values, slots, pad)
    elif slots is not None:
        slots = torch.where(slots < 0, pad, slots).to(slots.dtype)
    pool = place("conv_state", pool_values, device)
    total = case.tokens * case.steps
    x_all = _randn(case, "x", (case.batch, case.dim, total)).to(xdt)
    xs = [
        place(
            f"x[step {i}]",
            x_all[:, :, i * case.tokens : (i + 1) * case.tokens],
            device,
            case.layout,
            case.gap,
        )
        for i in range(case.steps)
    ]
    weight, bias = _params(case, device)
    seqlens = None
    if case.circular:
        # Start anywhere in [0, 2S) so the ring wraps within the first steps.
        start = torch.randint(
            0, 2 * case.state_len, (case.batch,), generator=_gen(case, "cache"), dtype=torch.int32
        )
        seqlens = [(start + i * case.tokens).to(device) for i in range(case.steps)]
    if slots is None:
        named = list(range(case.batch))
    else:
        named = sorted({int(s) for s in slots.tolist() if s >= 0 and s != pad})
        slots = slots.to(device)
    return UpdateInputs(pool, xs, weight, bias, slots, seqlens, named, pad)
