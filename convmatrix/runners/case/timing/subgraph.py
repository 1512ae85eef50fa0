"""The ``subgraph`` timing scope: the conv under test inside a small Mamba-style block.

A kernel's advantage can vanish around it (docs/spec.md §5), so the third scope times what a model
runs: ``in_proj`` (a Linear to 2C), the split into x and the gate z, the conv (with the case's
activation, state, packing), ``y * silu(z)``, ``out_proj`` (a Linear back to d_model), with
``d_model = C // 2`` (Mamba's expand = 2). The split follows the case's layout as the two Mamba
generations do: ``channel_first`` is Mamba1's (B, 2C, L) projection, so x is a channel slice of
a time-contiguous buffer; ``channel_last`` is Mamba2's (B, L, 2C), so x is a channel-contiguous
slice. ``fwd`` runs the block without autograd, ``fwd_bwd`` forward and backward (every
parameter and the block input get gradients), ``update`` one decode step of ``tokens`` tokens
(mode ``advance``: the request's state keeps moving).

Work (``block_work``): the conv's own ``work_of`` plus, per token, the two Linears (2 flops per
multiply-add; backward twice that: input and weight gradients) and the gate (SiLU 4 + 1 multiply
forward, 10 backward); bytes as each unfused step reads its inputs and writes its outputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from convmatrix.core.case import Case
from convmatrix.core.dtypes import ITEMSIZE, torch_dtype
from convmatrix.runners.case.inputs import ForwardInputs, UpdateInputs, case_seed
from convmatrix.runners.case.timing.perfmodel import Work, work_of
from convmatrix.runners.case.timing.scopes import Timed

__all__ = ["block_work", "d_model", "subgraph_scope"]


def d_model(case: Case) -> int:
    return max(1, case.dim // 2)


def block_work(case: Case) -> Work:
    """F and D of the block around the conv (see the module docstring)."""
    tokens = case.batch * ((case.tokens if case.op == "update" else case.seqlen) or 0)
    c, d = case.dim, d_model(case)
    s = ITEMSIZE[case.x_dtype]
    flops = 2.0 * tokens * d * 2 * c + 2.0 * tokens * c * d + 5.0 * tokens * c
    moved = s * (tokens * d + 2 * c * d + tokens * 2 * c)  # in_proj: u, W_in in; xz out
    moved += s * 3 * tokens * c  # gate: y, z in; h out
    moved += s * (tokens * c + c * d + tokens * d)  # out_proj: h, W_out in; out
    if case.op == "fwd_bwd":
        flops += 2 * (flops - 5.0 * tokens * c) + 10.0 * tokens * c
        moved *= 2
    return work_of(case) + Work(flops, moved)


class _Block:
    """Deterministic block parameters for one case (seeded from the case id)."""

    def __init__(self, case: Case, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(case_seed(case, "x") ^ 0x5EED)
        dtype = torch_dtype(case.x_dtype)
        c, d = case.dim, d_model(case)
        self.case = case
        self.w_in = (torch.randn(2 * c, d, generator=gen) / math.sqrt(d)).to(device, dtype)
        self.w_out = (torch.randn(d, c, generator=gen) / math.sqrt(c)).to(device, dtype)
        length = (case.tokens if case.op == "update" else case.seqlen) or 0
        self.u = torch.randn(case.batch, length, d, generator=gen).to(device, dtype)
        self.g = torch.randn(case.batch, length, d, generator=gen).to(device, dtype)

    def split(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x and z as (B, C, L) views of the in_proj output, in the case's layout."""
        c = self.case.dim
        xz = F.linear(u, self.w_in)  # (B, L, 2C)
        if self.case.layout == "channel_last":
            xz = xz.transpose(1, 2)  # Mamba2: channels innermost
        else:
            xz = xz.transpose(1, 2).contiguous()  # Mamba1: (B, 2C, L)
        return xz[:, :c], xz[:, c:]

    def finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return F.linear((y * F.silu(z)).transpose(1, 2), self.w_out)  # (B, L, d_model)


def _forward_block(kernel: Any, case: Case, fi: ForwardInputs, device: torch.device) -> Timed:
    block = _Block(case, device)
    weight = fi.weight.view.detach()
    bias = None if fi.bias is None else fi.bias.view.detach()
    state = None if fi.initial_state is None else fi.initial_state.view.detach()
    backward = case.op == "fwd_bwd"
    params = [t for t in (block.u, block.w_in, block.w_out, weight, bias, state) if t is not None]
    for t in params:
        t.requires_grad_(backward)

    def run() -> object:
        with torch.set_grad_enabled(backward):
            x, z = block.split(block.u)
            y = kernel.forward(
                x, weight, bias, initial_state=state, seq_idx=fi.seq_idx,
                activation=case.activation,
            )  # fmt: skip
            out = block.finish(y, z)
            if backward:
                return torch.autograd.grad(out, params, block.g)
            return out

    return Timed("subgraph", run, block_work(case), dense=True)


def _update_block(kernel: Any, case: Case, ui: UpdateInputs, device: torch.device) -> Timed:
    block = _Block(case, device)
    pool, weight = ui.pool.view, ui.weight.view
    bias = None if ui.bias is None else ui.bias.view
    seqlens = None if ui.cache_seqlens is None else ui.cache_seqlens[0].clone()
    step = case.tokens or 0

    def advance() -> None:
        if seqlens is not None:
            seqlens.add_(step)

    def run() -> object:
        with torch.no_grad():
            x, z = block.split(block.u)
            y = kernel.update(
                x, pool, weight, bias, activation=case.activation, cache_seqlens=seqlens,
                state_indices=ui.slots,
            )  # fmt: skip
            return block.finish(y, z)

    return Timed("subgraph", run, block_work(case), "advance", setup=advance, dense=True)


def subgraph_scope(kernel: Any, case: Case, inputs: ForwardInputs | UpdateInputs) -> Timed:
    """The block around ``kernel`` for ``case``, on the device of ``inputs``."""
    if isinstance(inputs, UpdateInputs):
        return _update_block(kernel, case, inputs, inputs.pool.view.device)
    return _forward_block(kernel, case, inputs, inputs.x.view.device)
