"""Calling a kernel on a case's tensors, and the float64 reference on the same values.

``kernel_outputs`` runs a kernel (the one under test, or the ``torch`` framework path) and
returns every compared output by name; ``reference_outputs`` computes the same names in float64
from exactly the rounded values the kernel saw. Any exception the kernel raises comes back as
``KernelFault`` so the caller can tell a kernel failure from a harness bug.

Output names (``convmatrix.core.tolerances.OUTPUTS``): y and F (final state, when asked),
dx, dw, db (when bias), dS (when an initial state is given) for ``fwd_bwd``; for ``update`` y
(all steps' tokens concatenated along time) and state (the pool rows a slot names).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.sanitise import safe_str
from convmatrix.kernels.interface.semantics import decode_prefix, pool_rows, write_decode_state
from convmatrix.kernels.oracle.reference import (
    backward_magnitudes,
    conv_backward,
    conv_forward,
    forward_magnitudes,
)
from convmatrix.runners.defaults import ProcessState, note_changes
from convmatrix.runners.inputs import ForwardInputs, UpdateInputs
from convmatrix.runners.refcache.cache import ReferenceCache
from convmatrix.runners.refcache.compact import Expanded, Span, StoredBlock, compact, expand
from convmatrix.runners.refcache.footprint import BLOCK_ELEMENTS, channels_per_block
from convmatrix.runners.refcache.key import BoundSpec, cache_key

__all__ = [
    "Judged",
    "KernelFault",
    "Reference",
    "call_forward",
    "channel_blocks",
    "channels_of",
    "check_outputs",
    "judged_blocks",
    "kernel_outputs",
    "reference_blocks",
    "reference_bounded",
    "reference_outputs",
]

# Reference values by output name, and (with magnitudes) the bound model's inputs per output.
Reference = tuple[dict[str, torch.Tensor], dict[str, Magnitudes]]
# Reference values and bounds by output name, both float64: what judging reads.
Judged = Expanded  # r, bound and slack magnitudes per output (``refcache.compact``)

F64 = torch.float64


class KernelFault(Exception):
    """The kernel raised, or returned something of the wrong structure."""


def _expected(inputs: ForwardInputs | UpdateInputs) -> dict[str, torch.Tensor]:
    """The input each output must match in dtype and device (the contract, docs/spec.md §4:
    y and the final state F like x, each gradient like its parameter)."""
    if isinstance(inputs, UpdateInputs):
        return {"y": inputs.xs[0].view, "state": inputs.pool.view}
    like = {"y": inputs.x.view, "F": inputs.x.view, "dx": inputs.x.view, "dw": inputs.weight.view}
    if inputs.bias is not None:
        like["db"] = inputs.bias.view
    if inputs.initial_state is not None:
        like["dS"] = inputs.initial_state.view
    return like


def check_outputs(got: dict[str, Any], inputs: ForwardInputs | UpdateInputs) -> None:
    """``KernelFault`` naming the first output whose type, dtype or device breaks the
    contract (a float64 y, or final state, for a float16 case would otherwise pass every
    error check; a final state on ``meta`` or as a numpy array is the kernel's failure)."""
    for name, ref in _expected(inputs).items():
        out = got.get(name)
        if out is None:
            continue
        if not isinstance(out, torch.Tensor):
            raise KernelFault(f"{name} is a {type(out).__name__}, not a tensor")
        if out.dtype != ref.dtype:
            raise KernelFault(f"{name} has dtype {out.dtype}, the case's input has {ref.dtype}")
        if out.device != ref.device:
            raise KernelFault(f"{name} is on {out.device}, the case's input on {ref.device}")


def _kernel_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` (a kernel's entry point, or autograd through it) called with the process's torch
    defaults captured before and restored after (``runners.defaults``): what a kernel changed
    must not reach the reference computed next. An exception is the kernel's failure, even
    one whose text cannot be had (``safe_str``)."""
    state = ProcessState.capture()
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise KernelFault(f"kernel raised {type(exc).__name__}: {safe_str(exc)}") from exc
    finally:
        note_changes(state.restore())


def _tensor(name: str, value: Any) -> torch.Tensor:
    """``value`` if it is a tensor, else the kernel's failure (a numpy array, a list, None)."""
    if not isinstance(value, torch.Tensor):
        raise KernelFault(f"{name} is a {type(value).__name__}, not a tensor")
    return value


def call_forward(
    kernel: Any,
    case: Case,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, F or None) from one forward call, checking the returned structure."""
    out = _kernel_call(
        kernel.forward,
        x,
        weight,
        bias,
        initial_state=initial_state,
        seq_idx=seq_idx,
        return_final_state=final_state,
        activation=case.activation,
    )
    if final_state:
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise KernelFault("return_final_state=True but the kernel did not return (y, F)")
        return _tensor("y", out[0]), _tensor("F", out[1])
    if not isinstance(out, torch.Tensor):
        raise KernelFault(f"forward returned {type(out).__name__}, not a tensor")
    return out, None


def grads(
    outs: list[torch.Tensor | None],
    upstream: list[torch.Tensor | None],
    params: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """d(sum <upstream_i, out_i>)/d(params) via autograd; unused parameters get zeros."""
    pairs = [
        (o, u.to(o.device, o.dtype))
        for o, u in zip(outs, upstream, strict=True)
        if o is not None and u is not None and o.grad_fn is not None
    ]
    if not pairs:
        raise KernelFault("no output of the kernel is differentiable (no grad_fn)")
    got = _kernel_call(
        torch.autograd.grad,
        [o for o, _ in pairs],
        list(params.values()),
        [u for _, u in pairs],
        allow_unused=True,
    )
    return {
        name: torch.zeros_like(p) if d is None else _tensor(name, d)
        for (name, p), d in zip(params.items(), got, strict=True)
    }


def _forward_outputs(kernel: Any, case: Case, fi: ForwardInputs) -> dict[str, torch.Tensor]:
    backward = case.op == "fwd_bwd"
    params = {"dx": fi.x.view, "dw": fi.weight.view}
    if fi.bias is not None:
        params["db"] = fi.bias.view
    if fi.initial_state is not None:
        params["dS"] = fi.initial_state.view
    for p in params.values():
        p.requires_grad_(backward)
    with torch.set_grad_enabled(backward):
        y, final = call_forward(
            kernel,
            case,
            fi.x.view,
            fi.weight.view,
            None if fi.bias is None else fi.bias.view,
            None if fi.initial_state is None else fi.initial_state.view,
            fi.seq_idx,
            bool(case.final_state),
        )
        out = {"y": y}
        if final is not None:
            out["F"] = final
        check_outputs(out, fi)  # a y or F of the wrong dtype or device: before autograd
        if backward:
            dy = fi.g if fi.g_view is None else fi.g_view
            out.update(grads([y, final], [dy, fi.q], params))
    return {k: v.detach() for k, v in out.items()}


def _update_outputs(kernel: Any, case: Case, ui: UpdateInputs) -> dict[str, torch.Tensor]:
    ys = []
    with torch.no_grad():
        for i, x in enumerate(ui.xs):
            y = _kernel_call(
                kernel.update,
                x.view,
                ui.pool.view,
                ui.weight.view,
                None if ui.bias is None else ui.bias.view,
                activation=case.activation,
                cache_seqlens=None if ui.cache_seqlens is None else ui.cache_seqlens[i],
                state_indices=ui.slots,
            )
            if not isinstance(y, torch.Tensor):
                raise KernelFault(f"update returned {type(y).__name__}, not a tensor")
            ys.append(y)
    try:
        y_all = torch.cat(ys, dim=2)
    except RuntimeError as exc:
        raise KernelFault(f"update outputs do not concatenate: {exc}") from exc
    return {"y": y_all, "state": ui.pool.view[ui.named_rows].clone()}


def kernel_outputs(
    kernel: Any, case: Case, inputs: ForwardInputs | UpdateInputs
) -> dict[str, torch.Tensor]:
    """Every compared output of one kernel on one case's tensors (device tensors)."""
    if isinstance(inputs, UpdateInputs):
        return _update_outputs(kernel, case, inputs)
    return _forward_outputs(kernel, case, inputs)


def channels_of(t: torch.Tensor | None, block: slice | None, dim: int = 1) -> torch.Tensor | None:
    """Channels ``block`` of ``t`` (a view; all of it for None)."""
    if t is None or block is None:
        return t
    return t.narrow(dim, block.start, block.stop - block.start)


def _reference_forward(
    case: Case, fi: ForwardInputs, magnitudes: bool, block: slice | None = None
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


def _reference_update(case: Case, ui: UpdateInputs, magnitudes: bool) -> Reference:
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


def reference_outputs(case: Case, inputs: ForwardInputs | UpdateInputs) -> dict[str, torch.Tensor]:
    """The float64 reference for every compared output (CPU tensors; state in its dtype)."""
    if isinstance(inputs, UpdateInputs):
        return _reference_update(case, inputs, False)[0]
    return _reference_forward(case, inputs, False)[0]


def reference_bounded(case: Case, inputs: ForwardInputs | UpdateInputs) -> Reference:
    """``reference_outputs`` and, per output, what the bound model needs (docs/spec.md §4)."""
    if isinstance(inputs, UpdateInputs):
        return _reference_update(case, inputs, True)
    return _reference_forward(case, inputs, True)


def channel_blocks(case: Case, inputs: ForwardInputs | UpdateInputs) -> list[slice | None]:
    """The channel blocks ``reference_blocks`` yields, ``BLOCK_ELEMENTS`` elements per tensor
    at most (``refcache.footprint``): [None] (all at once) for updates (small, and their
    reference replays the slots) and for cases of one block."""
    if isinstance(inputs, UpdateInputs):
        return [None]
    batch, dim, seqlen = inputs.x.values.shape
    per = channels_per_block(batch, seqlen, case.width, BLOCK_ELEMENTS)
    if per >= dim:
        return [None]
    return [slice(c, min(c + per, dim)) for c in range(0, dim, per)]


def _on(device: torch.device, inputs: ForwardInputs) -> ForwardInputs:
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


def _compute_blocks(
    case: Case, inputs: ForwardInputs | UpdateInputs, blocks: list[slice | None], device: Any
) -> Iterator[tuple[slice | None, Reference]]:
    if isinstance(inputs, UpdateInputs) or device is None:
        on = inputs  # updates are small, and replay their slots on the host
    else:
        on = _on(device, inputs)
    for block in blocks:
        if block is None:
            yield block, reference_bounded(case, on)
        else:
            yield block, _reference_forward(case, on, True, block)  # type: ignore[arg-type]


def reference_blocks(
    case: Case,
    inputs: ForwardInputs | UpdateInputs,
    blocks: list[slice | None],
    *,
    device: torch.device | None = None,
) -> Iterator[tuple[slice | None, Reference]]:
    """(block, float64 reference and magnitudes of the block) for each channel block,
    computed one at a time on ``device`` (None: the host). Judging reads ``judged_blocks``."""
    yield from _compute_blocks(case, inputs, blocks, device)


def _span(block: slice | None) -> Span:
    return None if block is None else (block.start, block.stop)


def judged_blocks(
    case: Case,
    inputs: ForwardInputs | UpdateInputs,
    blocks: list[slice | None],
    spec: BoundSpec,
    *,
    device: torch.device | None = None,
    cache: ReferenceCache | None = None,
) -> Iterator[tuple[slice | None, Judged]]:
    """(block, (r, bound, slack magnitudes) per output) for each channel block, in float64 on
    ``device``
    (None: the host), from the stored form (``refcache.compact``) whether computed now or
    read from ``cache``. A forward case the cache admits is read from its entry, each block
    checked before it is used; the blocks an entry lacks or fails on are computed, and a
    case not read whole is stored. Update cases are neither moved nor cached: small, and
    their reference replays slots."""
    if cache is None or isinstance(inputs, UpdateInputs) or not cache.admits(case):
        for block, (refs, mags) in _compute_blocks(case, inputs, blocks, device):
            yield block, expand(case, compact(case, _span(block), refs, mags, spec))
        return
    spans = [_span(b) for b in blocks]
    where = "cpu" if device is None else device.type
    key = cache_key(case, inputs, spans, spec, where)
    kept: list[StoredBlock] = []
    for stored in cache.read(key, spans):
        kept.append(stored)
        yield blocks[len(kept) - 1], expand(case, stored.to(device))
    if len(kept) == len(blocks):
        return
    rest = _compute_blocks(case, inputs, blocks[len(kept) :], device)
    for block, (refs, mags) in rest:
        stored = compact(case, _span(block), refs, mags, spec)
        kept.append(stored)
        yield block, expand(case, stored)
    cache.write(key, kept)
