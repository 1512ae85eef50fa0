"""Forward of the tiled kernel, written as the seed's MLU design (chapter 8)::

    for each owned (batch, time_tile, channel_tile):
        local_x = load(current tile and left halo)          # T+K-1 positions
        local_z = broadcast(bias)                            # FP32
        for k in 0 .. K-1:
            local_z += local_x[k:k+T, :] * weight[:, k]      # one shifted view per tap
        local_y = silu(local_z) if enabled else local_z
        store(valid part of local_y)                         # rounded once, to x's dtype

One loop iteration runs every (batch, channel tile) task of one time tile at once. The task of
the last time tile also stores the final state: its buffer already holds the last K-1 inputs
(from the state itself when L < K-1, the "short chunk").

Packed sequences: tap k of token t is live when token t-(K-1)+k has t's sequence id and is
not padding (``semantics.packed_tap_masks``); padding tokens store 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from convmatrix.core.contract import Geometry
from convmatrix.kernels.builtin.tiled.tiles import Placed, TilePlan, plan_tiles, token_window
from convmatrix.kernels.interface.semantics import packed_tap_masks

__all__ = ["Operands", "accumulate_taps", "forward_tiles", "prepare", "tiled_forward"]

F32 = torch.float32


@dataclass(frozen=True)
class Operands:
    """What every task of one call shares: the plan, FP32 weights and bias padded to whole
    channel tiles, the packed-sequence masks, and the input's position-indexed sources."""

    plan: TilePlan
    taps: torch.Tensor  # (K, padded_dim) FP32: taps[k] multiplies token t-(K-1)+k
    bias: torch.Tensor  # (padded_dim,) FP32, zeros without bias
    masks: torch.Tensor | None  # (K, B, L) FP32 live taps, packed only
    live: torch.Tensor | None  # (B, L) FP32 non-padding tokens, packed only
    inputs: tuple[Placed, ...]  # x at position 0, the initial state at -(K-1)


def prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    geometry: Geometry,
) -> Operands:
    width = weight.shape[1]
    plan = plan_tiles(x, width, geometry.time_tile, geometry.channel_tile)
    taps = plan.pad_channels(weight.to(F32)).t().contiguous()
    padded_bias = plan.pad_channels(
        bias.to(F32) if bias is not None else weight.new_zeros(plan.dim, dtype=F32)
    )
    masks = live = None
    if seq_idx is not None:
        seq_idx = seq_idx.to(x.device)
        masks = packed_tap_masks(seq_idx, width).to(F32)
        live = (seq_idx >= 0).to(F32)
    inputs: list[Placed] = [(x, 0)]
    if initial_state is not None:
        inputs.append((initial_state, -(width - 1)))
    return Operands(plan, taps, padded_bias, masks, live, tuple(inputs))


def accumulate_taps(ops: Operands, local_x: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """FP32 pre-activation z of ``count`` tokens starting at token ``first``.

    ``local_x`` is a loaded tile whose element 0 sits at position ``first - (K-1)``; tap k of
    output i reads the shifted view ``local_x[k + i]``.
    """
    plan = ops.plan
    shape = list(local_x.shape)
    shape[plan.time_axis] = count
    z = plan.per_channel(ops.bias).expand(shape).clone()
    masks = None if ops.masks is None else token_window(ops.masks, first, first + count)
    for k in range(plan.width):
        tap = plan.narrow(local_x, k, count)
        if masks is not None:
            tap = tap * plan.per_token(masks[k])
        z.addcmul_(tap, plan.per_channel(ops.taps[k]))
    return z


def tiled_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    silu: bool,
    geometry: Geometry,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, final_state) in x's dtype; y in x's layout, final_state (B, C, K-1)."""
    ops = prepare(x, weight, bias, initial_state, seq_idx, geometry)
    return forward_tiles(ops, x.dtype, silu, initial_state)


def forward_tiles(
    ops: Operands, dtype: torch.dtype, silu: bool, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tile loop of ``tiled_forward`` on prepared operands (the ``kernel`` timing scope
    times this alone: ``prepare``'s FP32 casts and channel padding stay outside)."""
    plan, halo, tile = ops.plan, ops.plan.width - 1, ops.plan.time_tile
    y = plan.empty_output(dtype)
    final = torch.zeros(plan.batch, plan.dim, halo, dtype=dtype, device=plan.device)
    if plan.seqlen == 0 and initial_state is not None:  # nothing to run: F is the state
        final.copy_(initial_state)
    for j in range(plan.n_time_tiles):
        t0 = j * tile
        local = plan.load(ops.inputs, t0 - halo, t0 + tile)
        z = accumulate_taps(ops, local.tile, t0, tile)
        if silu:
            z = z * torch.sigmoid(z)
        if ops.live is not None:
            z = z * plan.per_token(token_window(ops.live, t0, t0 + tile))
        plan.store(z, t0, [(y, 0)])
        if j == plan.n_time_tiles - 1:
            # Window positions [L-(K-1), L) are buffer elements [L-t0, L-t0+K-1).
            start = plan.seqlen - t0
            final.copy_(local.logical[..., start : start + halo])
    return y, final
