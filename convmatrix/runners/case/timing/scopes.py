"""The three timing scopes of docs/spec.md §5, as zero-argument callables over a case's tensors.

- ``kernel``: the adapter's core on inputs already in its layout (``kernel.core_call``, see
  ``convmatrix.kernels.interface.corecall``). A kernel without one is timed by its public call on
  contiguous copies under the scope ``kernel~op``, so it is never compared with a real core.
  For ``fwd_bwd`` also ``kernel.bwd``: the backward core alone.
- ``op``: the public call from the case's canonical inputs (strided views, the case's dtypes),
  so layout and dtype conversion, argument checks, workspace zeroing and the second reduction
  stage are in it. ``fwd``: ``forward`` without autograd; ``fwd_bwd``: ``forward`` then
  ``autograd.grad``; ``op.bwd``: the backward alone on a retained graph. ``update``: one decode
  step of ``tokens`` tokens, in mode ``reset`` (the state pool restored before each
  repetition, outside the timed region) and ``advance`` (one request keeps advancing: the
  state shifts, a ring's ``cache_seqlens`` moves on by ``tokens`` between calls).
- ``subgraph``: ``convmatrix.runners.case.timing.subgraph``, the conv inside a small Mamba-style
block.

Each ``Timed`` carries its ``Work`` (``convmatrix.runners.case.timing.perfmodel``) for the time
floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.kernels.interface.corecall import CoreArgs, core_call_of
from convmatrix.runners.case.inputs import ForwardInputs, UpdateInputs
from convmatrix.runners.case.timing.perfmodel import Work, backward_work, work_of

__all__ = ["FALLBACK", "Timed", "kernel_scopes", "op_scopes"]

FALLBACK = "~op"  # suffix of a kernel scope timed through the public call (no core_call)


@dataclass
class Timed:
    """One thing to time: ``fn`` per repetition, ``setup`` before it (untimed)."""

    scope: str
    fn: Callable[[], object]
    work: Work
    mode: str | None = None
    setup: Callable[[], None] | None = None
    dense: bool = False  # the work includes dense layers: bound its flops at the GEMM rate


def _view(t: Any) -> torch.Tensor | None:
    return None if t is None else t.view


@dataclass
class _Forward:
    """A case's forward arguments on the device, plus the upstream gradients for backward."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    state: torch.Tensor | None
    seq_idx: torch.Tensor | None
    g: torch.Tensor | None
    q: torch.Tensor | None

    @classmethod
    def of(cls, fi: ForwardInputs, device: torch.device) -> _Forward:
        x = fi.x.view
        g, q = (None if t is None else t.to(device, x.dtype) for t in (fi.g, fi.q))
        return cls(x, fi.weight.view, _view(fi.bias), _view(fi.initial_state), fi.seq_idx, g, q)

    def leaves(self) -> list[torch.Tensor]:
        return [t for t in (self.x, self.weight, self.bias, self.state) if t is not None]

    def contiguous(self) -> _Forward:
        x, w, b, s = (
            None if t is None else t.detach().contiguous()
            for t in (self.x, self.weight, self.bias, self.state)
        )
        assert x is not None and w is not None
        return _Forward(x, w, b, s, self.seq_idx, self.g, self.q)


def _call(kernel: Any, case: Case, a: _Forward) -> list[torch.Tensor]:
    """The public forward; [y] or [y, F]."""
    out = kernel.forward(
        a.x, a.weight, a.bias, initial_state=a.state, seq_idx=a.seq_idx,
        return_final_state=bool(case.final_state), activation=case.activation,
    )  # fmt: skip
    return list(out) if isinstance(out, tuple | list) else [out]


def _grad(outs: list[torch.Tensor], a: _Forward, retain: bool) -> object:
    upstream = [a.g, a.q][: len(outs)]
    pairs = [(o, u) for o, u in zip(outs, upstream, strict=True) if u is not None]
    return torch.autograd.grad(
        [o for o, _ in pairs], a.leaves(), [u for _, u in pairs], retain_graph=retain,
        allow_unused=True,
    )  # fmt: skip


def forward_op(kernel: Any, case: Case, a: _Forward) -> Timed:
    """The public call of a forward case: ``fwd`` without autograd, ``fwd_bwd`` with it."""
    backward = case.op == "fwd_bwd"
    for t in a.leaves():
        t.requires_grad_(backward)
    if not backward:

        def fwd() -> object:
            with torch.no_grad():
                return _call(kernel, case, a)

        return Timed("op", fwd, work_of(case))
    return Timed("op", lambda: _grad(_call(kernel, case, a), a, False), work_of(case))


def _op_backward(kernel: Any, case: Case, a: _Forward) -> Timed:
    """``op.bwd``: the public backward alone, on a graph built once (untimed)."""
    for t in a.leaves():
        t.requires_grad_(True)
    outs = _call(kernel, case, a)
    return Timed("op.bwd", lambda: _grad(outs, a, True), backward_work(case))


def _core(kernel: Any, case: Case, a: _Forward, op: str) -> Callable[[], object] | None:
    hook = core_call_of(kernel)
    if hook is None:
        return None
    grad = op in ("fwd_bwd", "bwd")
    args = CoreArgs(
        op=op, x=a.x.detach(), weight=a.weight.detach(),
        bias=None if a.bias is None else a.bias.detach(), activation=case.activation,
        initial_state=None if a.state is None else a.state.detach(), seq_idx=a.seq_idx,
        return_final_state=bool(case.final_state), grad_y=a.g if grad else None,
        grad_final=a.q if grad else None,
    )  # fmt: skip
    return hook(args)


def op_scopes(kernel: Any, case: Case, inputs: ForwardInputs | UpdateInputs) -> list[Timed]:
    """The ``op`` scope (and ``op.bwd`` for ``fwd_bwd``; both update modes)."""
    if isinstance(inputs, UpdateInputs):
        return _update_ops(kernel, case, inputs)
    device = inputs.x.view.device
    timed = [forward_op(kernel, case, _Forward.of(inputs, device))]
    if case.op == "fwd_bwd":
        timed.append(_op_backward(kernel, case, _Forward.of(inputs, device)))
    return timed


def kernel_scopes(kernel: Any, case: Case, inputs: ForwardInputs | UpdateInputs) -> list[Timed]:
    """The ``kernel`` scope (and ``kernel.bwd``), or ``kernel~op`` when there is no core."""
    if isinstance(inputs, UpdateInputs):
        return _update_kernel(kernel, case, inputs)
    a = _Forward.of(inputs, inputs.x.view.device)
    core = _core(kernel, case, a, case.op)
    if core is None:
        fallback = forward_op(kernel, case, a.contiguous())
        fallback.scope = "kernel" + FALLBACK
        return [fallback]
    timed = [Timed("kernel", core, work_of(case))]
    if case.op == "fwd_bwd":
        bwd = _core(kernel, case, a, "bwd")
        if bwd is not None:
            timed.append(Timed("kernel.bwd", bwd, backward_work(case)))
    return timed


# -- updates ----------------------------------------------------------------------------------
def _update_call(
    kernel: Any, case: Case, ui: UpdateInputs, seqlens: Any, contiguous: bool = False
) -> Callable[[], object]:
    x, pool, weight, bias = ui.xs[0].view, ui.pool.view, ui.weight.view, _view(ui.bias)
    if contiguous:
        x, weight = x.contiguous(), weight.contiguous()

    def step() -> object:
        with torch.no_grad():
            return kernel.update(
                x, pool, weight, bias, activation=case.activation, cache_seqlens=seqlens,
                state_indices=ui.slots,
            )  # fmt: skip

    return step


def _reset(kernel: Any, case: Case, ui: UpdateInputs, contiguous: bool = False) -> Timed:
    pool = ui.pool.view
    saved = pool.detach().clone()
    first = None if ui.cache_seqlens is None else ui.cache_seqlens[0]
    step = _update_call(kernel, case, ui, first, contiguous)
    return Timed("op", step, work_of(case), "reset", setup=lambda: pool.copy_(saved))


def _update_ops(kernel: Any, case: Case, ui: UpdateInputs) -> list[Timed]:
    reset = _reset(kernel, case, ui)
    first = None if ui.cache_seqlens is None else ui.cache_seqlens[0]
    moving = None if first is None else first.clone()
    step = case.tokens or 0

    def advance_seqlens() -> None:
        if moving is not None:
            moving.add_(step)

    advance = Timed("op", _update_call(kernel, case, ui, moving), work_of(case), "advance",
                    setup=advance_seqlens)  # fmt: skip
    return [reset, advance]


def _update_kernel(kernel: Any, case: Case, ui: UpdateInputs) -> list[Timed]:
    """The update core is stateless (the history is gathered before): mode ``reset``."""
    hook = core_call_of(kernel)
    args = CoreArgs(
        op="update", x=ui.xs[0].view, weight=ui.weight.view, bias=_view(ui.bias),
        activation=case.activation, conv_state=ui.pool.view,
        cache_seqlens=None if ui.cache_seqlens is None else ui.cache_seqlens[0],
        state_indices=ui.slots,
    )  # fmt: skip
    core = None if hook is None else hook(args)
    if core is not None:
        return [Timed("kernel", core, work_of(case), "reset")]
    fallback = _reset(kernel, case, ui, contiguous=True)
    fallback.scope = "kernel" + FALLBACK
    return [fallback]
