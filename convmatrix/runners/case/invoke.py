"""Calling a kernel on a case's tensors.

``kernel_outputs`` runs a kernel (the one under test, or the ``torch`` framework path) and
returns every compared output by name; the float64 reference computes the same names from
exactly the rounded values the kernel saw (``kernels.oracle.steps``, through
``runners.case.reference``). Any exception the kernel raises comes back as ``KernelFault`` so
the caller can tell a kernel failure from a harness bug.

Output names (``convmatrix.core.tolerances.OUTPUTS``): y and F (final state, when asked),
dx, dw, db (when bias), dS (when an initial state is given) for ``fwd_bwd``; for ``update`` y
(all steps' tokens concatenated along time) and state (the pool rows a slot names).
"""

from __future__ import annotations

from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.sanitise import safe_str
from convmatrix.runners.case.defaults import ProcessState, note_changes
from convmatrix.runners.case.inputs import ForwardInputs, UpdateInputs

__all__ = ["KernelFault", "call_forward", "check_outputs", "grads", "kernel_outputs"]


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
    defaults captured before and restored after (``runners.case.defaults``): what a kernel changed
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
