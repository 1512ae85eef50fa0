"""The float64 reference of one case, step by step: the runners' one door into the oracle.

``reference_blocks`` computes, for each channel block of a case, every compared output in
float64 from exactly the rounded values the kernel saw, with what the bound model needs per
output (``Magnitudes``, docs/spec.md §4). The runners judge a case through it
(``runners.case.reference``, which reads and writes the reference cache around it); chunk
consistency asks for two small references of its own (``final_state_reference``,
``state_grad_reference``).

The inputs are the case's tensors as ``runners.case.inputs`` builds them, read only through
the fields named by ``ForwardValues`` / ``UpdateValues`` (each guarded tensor's ``values``:
CPU, contiguous, in the buffer's dtype), so the oracle imports nothing above it.

Output names (``convmatrix.core.tolerances.OUTPUTS``): y and F (final state, when asked),
dx, dw, db (when bias), dS (when an initial state is given) for ``fwd_bwd``; for ``update`` y
(all steps' tokens concatenated along time) and state (the pool rows a slot names).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.kernels.interface.semantics import (
    decode_prefix,
    final_state,
    pool_rows,
    write_decode_state,
)
from convmatrix.kernels.oracle.reference import (
    backward_magnitudes,
    conv_backward,
    conv_forward,
    forward_magnitudes,
)

__all__ = [
    "ForwardValues",
    "Reference",
    "UpdateValues",
    "channels_of",
    "final_state_reference",
    "reference_blocks",
    "reference_bounded",
    "reference_outputs",
    "state_grad_reference",
]

# Reference values by output name, and (with magnitudes) the bound model's inputs per output.
Reference = tuple[dict[str, torch.Tensor], dict[str, Magnitudes]]

F64 = torch.float64


class Values(Protocol):
    """A guarded tensor as the oracle reads it: the values the kernel's view held."""

    @property
    def values(self) -> torch.Tensor: ...


class ForwardValues(Protocol):
    """A forward case's tensors (``runners.case.inputs.ForwardInputs``)."""

    @property
    def x(self) -> Values: ...
    @property
    def weight(self) -> Values: ...
    @property
    def bias(self) -> Values | None: ...
    @property
    def initial_state(self) -> Values | None: ...
    @property
    def seq_idx(self) -> torch.Tensor | None: ...
    @property
    def g(self) -> torch.Tensor | None: ...
    @property
    def q(self) -> torch.Tensor | None: ...


class UpdateValues(Protocol):
    """An update case's tensors (``runners.case.inputs.UpdateInputs``)."""

    @property
    def pool(self) -> Values: ...
    @property
    def xs(self) -> Sequence[Values]: ...
    @property
    def weight(self) -> Values: ...
    @property
    def bias(self) -> Values | None: ...
    @property
    def cache_seqlens(self) -> list[torch.Tensor] | None: ...
    @property
    def named_rows(self) -> list[int]: ...
    def canonical_slots(self) -> torch.Tensor | None: ...


Inputs = ForwardValues | UpdateValues


def channels_of(t: torch.Tensor | None, block: slice | None, dim: int = 1) -> torch.Tensor | None:
    """Channels ``block`` of ``t`` (a view; all of it for None)."""
    if t is None or block is None:
        return t
    return t.narrow(dim, block.start, block.stop - block.start)


def _reference_forward(
    case: Case, fi: ForwardValues, magnitudes: bool, block: slice | None = None
) -> Reference:
    """The reference of channels ``block`` (all for None): channels are independent."""
    y, final, saved = conv_forward(
        channels_of(fi.x.values, block),
        channels_of(fi.weight.values, block, 0),
        None if fi.bias is None else channels_of(fi.bias.values, block, 0),
        None if fi.initial_state is None else channels_of(fi.initial_state.values, block),
        None if fi.seq_idx is None else fi.seq_idx.to(fi.x.values.device),
        case.activation,
        magnitudes=magnitudes,
    )
    out = {"y": y}
    mags = {"y": forward_magnitudes(saved, y)} if magnitudes else {}
    if case.final_state:
        out["F"] = final
        mags["F"] = Magnitudes(None, 0)  # a copy of inputs: only its rounding
    if case.op == "fwd_bwd":
        assert fi.g is not None
        w, g, q = (
            channels_of(fi.weight.values, block, 0),
            channels_of(fi.g, block),
            channels_of(fi.q, block),
        )
        if magnitudes:
            (dx, dw, db, ds), grad_mags = backward_magnitudes(saved, w, g, q)
            mags.update(grad_mags)
        else:
            dx, dw, db, ds = conv_backward(saved, w, g, q)
        out.update(dx=dx, dw=dw)
        if fi.bias is not None:
            out["db"] = db
        if fi.initial_state is not None:
            out["dS"] = ds
    return out, {k: v for k, v in mags.items() if k in out}


def _reference_update(case: Case, ui: UpdateValues, magnitudes: bool) -> Reference:
    """y of every new token from one forward over the whole history; the state after all
    steps by replaying the (exact) state writes."""
    slots = ui.canonical_slots()
    slots = None if slots is None else slots.cpu()
    live, rows = pool_rows(slots, case.batch, torch.device("cpu"))
    x_all = torch.cat([x.values for x in ui.xs], dim=2)
    state = ui.pool.values.index_select(0, rows)
    seqlens = None if ui.cache_seqlens is None else [s.cpu()[live] for s in ui.cache_seqlens]
    prefix = decode_prefix(state, case.width, None if seqlens is None else seqlens[0])
    y = torch.zeros(x_all.shape, dtype=F64)
    mags: dict[str, Magnitudes] = {}
    if magnitudes:
        mags["y"] = Magnitudes(torch.zeros_like(y), 0)
        mags["state"] = Magnitudes(None, 0)
    if live.numel():
        y_live, _, saved = conv_forward(
            x_all[live],
            ui.weight.values,
            None if ui.bias is None else ui.bias.values,
            prefix,
            None,
            case.activation,
            magnitudes=magnitudes,
        )
        y[live] = y_live
        if magnitudes:
            mags["y"] = _scatter_rows(forward_magnitudes(saved, y_live), live, y)
    for i, x in enumerate(ui.xs):
        state = write_decode_state(state, x.values[live], None if seqlens is None else seqlens[i])
    pool = ui.pool.values.clone()
    pool[rows] = state
    return {"y": y, "state": pool[ui.named_rows]}, mags


def _scatter_rows(m: Magnitudes, live: torch.Tensor, like: torch.Tensor) -> Magnitudes:
    """Magnitudes of the live rows placed in a full batch (padding rows: zeros)."""

    def full(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = torch.zeros_like(like)
        out[live] = t
        return out

    return Magnitudes(full(m.mag), m.n, full(m.elem), full(m.zsens), m.n_z)


def _update(case: Case, inputs: Inputs) -> UpdateValues | None:
    """``inputs`` as an update case's tensors, or None for a forward case (the case's op
    decides which tensors were built: ``runners.case.execute.build_inputs``)."""
    return inputs if case.op == "update" else None  # type: ignore[return-value]


def reference_outputs(case: Case, inputs: Inputs) -> dict[str, torch.Tensor]:
    """The float64 reference for every compared output (CPU tensors; state in its dtype)."""
    if (ui := _update(case, inputs)) is not None:
        return _reference_update(case, ui, False)[0]
    return _reference_forward(case, inputs, False)[0]  # type: ignore[arg-type]


def reference_bounded(case: Case, inputs: Inputs) -> Reference:
    """``reference_outputs`` and, per output, what the bound model needs (docs/spec.md §4)."""
    if (ui := _update(case, inputs)) is not None:
        return _reference_update(case, ui, True)
    return _reference_forward(case, inputs, True)  # type: ignore[arg-type]


def _on(device: torch.device, inputs: Any) -> Any:
    """The inputs with the values the reference reads on ``device`` (float64 there)."""
    if device.type == "cpu":
        return inputs

    def moved(g: Any) -> Any:
        return None if g is None else replace(g, values=g.values.to(device))

    return replace(
        inputs, x=moved(inputs.x), weight=moved(inputs.weight), bias=moved(inputs.bias),
        initial_state=moved(inputs.initial_state),
        seq_idx=None if inputs.seq_idx is None else inputs.seq_idx.to(device),
        g=None if inputs.g is None else inputs.g.to(device),
        q=None if inputs.q is None else inputs.q.to(device),
    )  # fmt: skip


def reference_blocks(
    case: Case,
    inputs: Inputs,
    blocks: list[slice | None],
    *,
    device: torch.device | None = None,
) -> Iterator[tuple[slice | None, Reference]]:
    """(block, float64 reference and magnitudes of the block) for each channel block,
    computed one at a time on ``device`` (None: the host). Update cases are small and replay
    their slots on the host. Judging reads ``runners.case.reference.judged_blocks``."""
    if _update(case, inputs) is not None or device is None:
        on = inputs
    else:
        on = _on(device, inputs)
    for block in blocks:
        if block is None:
            yield block, reference_bounded(case, on)
        else:
            yield block, _reference_forward(case, on, True, block)


def _state_values(case: Case, fi: ForwardValues) -> torch.Tensor:
    if fi.initial_state is not None:
        return fi.initial_state.values
    return torch.zeros(*fi.x.values.shape[:2], case.width - 1, dtype=fi.x.values.dtype)


def final_state_reference(case: Case, fi: ForwardValues) -> tuple[torch.Tensor, Magnitudes]:
    """F's exact value, the last K-1 of state ++ x (a copy: only its rounding)."""
    state = None if fi.initial_state is None else fi.initial_state.values
    return final_state(fi.x.values, state, case.width).to(torch.float64), Magnitudes(None, 0)


def state_grad_reference(case: Case, fi: ForwardValues) -> tuple[torch.Tensor, Magnitudes]:
    """dS from the first m = min(L, K-1) tokens: dS[j] sums w[k] dz[j-k] over t = j-k < K-1
    (and takes q where j >= L, when L < K-1), so no later token enters it."""
    m = min(fi.x.values.shape[2], case.width - 1)
    assert fi.g is not None
    _, _, saved = conv_forward(
        fi.x.values[..., :m], fi.weight.values, None if fi.bias is None else fi.bias.values,
        _state_values(case, fi), None if fi.seq_idx is None else fi.seq_idx[:, :m].cpu(),
        case.activation, magnitudes=True,
    )  # fmt: skip
    q = fi.q if m < case.width - 1 else None
    (_, _, _, ds), mags = backward_magnitudes(saved, fi.weight.values, fi.g[..., :m], q)
    return ds, mags["dS"]
