"""Backward of the tiled kernel: output ownership for dx, two-stage reduction for dw and db.

Seed, chapter 8: "let each task own a unique dx region and read the gradient to its right;
reduce dw and dbias explicitly, locally and then globally." Per (batch, time tile, channel
tile) task owning tokens ``[t0, t0+T)``:

- load the input on ``[t0-(K-1), t0+T+K-1)`` (``T+2K-2`` positions) and the upstream gradient
  g on ``[t0, t0+T+K-1)`` (``T+K-1``: the tile plus its right halo);
- recompute z on those ``T+K-1`` tokens and ``dz = g * silu'(z)`` (SiLU is recomputed from z,
  nothing but the inputs is kept from the forward);
- ``dx[p] = sum_k w[k] * dz[p+K-1-k]`` (live taps) for its own positions only, so no two tasks
  write the same dx element and no atomics are needed; the first time tile also owns the
  initial-state positions ``[-(K-1), 0)``, i.e. dS; the owner of a position adds dF's entry;
- partial sums of dw (K per channel) and db (1) over its own T tokens go to partial group
  ``(b * n_time_tiles + time_tile) % P`` of an FP32 workspace ``(P, C, K+1)``, 4*P*C*(K+1)
  bytes; a second stage reduces the P groups in a fixed order and casts to the weight dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from convmatrix.core.contract import Geometry
from convmatrix.kernels.builtin.tiled.forward import Operands, accumulate_taps, prepare
from convmatrix.kernels.builtin.tiled.tiles import Placed, token_window

__all__ = ["Gradients", "backward_tiles", "tiled_backward"]

F32 = torch.float32

Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


def _accumulate_partials(
    workspace: torch.Tensor, partial: torch.Tensor, time_tile: int, n_time_tiles: int
) -> None:
    """Stage 1: add each batch row's (C, K+1) partial of this time tile to its group.

    Tasks of one group add in ascending batch order, as one core running them would.
    """
    groups = workspace.shape[0]
    owner = [(b * n_time_tiles + time_tile) % groups for b in range(partial.shape[0])]
    for group in sorted(set(owner)):
        rows = [b for b, g in enumerate(owner) if g == group]
        workspace[group] += partial[rows].sum(0)


def _dx_tile(ops: Operands, dz_masked: list[torch.Tensor], start: int, count: int) -> torch.Tensor:
    """``sum_k w[k] * dz_k`` over window elements [start, start+count) of the left-padded dz.

    ``dz_masked[k]`` covers tokens ``[t0-(K-1), t0+T+K-1)`` (K-1 leading zeros); window element
    i is position ``t0-(K-1)+i``, which tap k of token ``position+K-1-k`` reads.
    """
    plan = ops.plan
    halo = plan.width - 1
    out = None
    for k in range(plan.width):
        term = plan.narrow(dz_masked[k], start + halo - k, count) * plan.per_channel(ops.taps[k])
        out = term if out is None else out.add_(term)
    return out


def tiled_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    silu: bool,
    geometry: Geometry,
    grad_y: torch.Tensor,
    grad_final: torch.Tensor | None,
    silu_grad: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Gradients:
    """(dx, dweight, dbias, dinitial_state) in the dtypes of x, weight, bias and the state.
    ``silu_grad`` replaces SiLU's derivative (seeded-bug kernels inject a wrong one)."""
    ops = prepare(x, weight, bias, initial_state, seq_idx, geometry)
    dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
    return backward_tiles(
        ops, dtypes, initial_state, silu, geometry, grad_y, grad_final, silu_grad or _silu_grad
    )


def backward_tiles(
    ops: Operands,
    dtypes: tuple[torch.dtype, torch.dtype, torch.dtype | None],
    initial_state: torch.Tensor | None,
    silu: bool,
    geometry: Geometry,
    grad_y: torch.Tensor,
    grad_final: torch.Tensor | None,
    silu_grad: Callable[[torch.Tensor], torch.Tensor] = _silu_grad,
) -> Gradients:
    """The tile loop and both reduction stages of ``tiled_backward`` on prepared operands;
    ``dtypes`` are those of (x, weight, bias). The workspace zeroing and the second stage are
    part of it: they are the backward's own cost, not a conversion."""
    x_dtype, w_dtype, b_dtype = dtypes
    plan, halo, tile = ops.plan, ops.plan.width - 1, geometry.time_tile
    groups = geometry.partial_groups or 1
    dx = plan.empty_output(x_dtype)
    dstate = None
    destinations: list[Placed] = [(dx, 0)]
    if initial_state is not None:
        dstate = torch.zeros_like(initial_state)
        destinations.append((dstate, -halo))
    grad_parts: list[Placed] = [(grad_y, 0)]
    final_parts: list[Placed] = []
    if grad_final is not None:
        final_parts.append((grad_final, plan.seqlen - halo))
    workspace = torch.zeros(groups, plan.dim, plan.width + 1, dtype=F32, device=plan.device)

    for j in range(plan.n_time_tiles):
        t0 = j * tile
        local_x = plan.load(ops.inputs, t0 - halo, t0 + tile + halo).tile  # T+2K-2
        local_g = plan.load(grad_parts, t0, t0 + tile + halo).tile  # T+K-1
        z = accumulate_taps(ops, local_x, t0, tile + halo)
        dz = local_g * silu_grad(z) if silu else local_g
        if ops.live is not None:
            dz = dz * plan.per_token(token_window(ops.live, t0, t0 + tile + halo))
        masks = None if ops.masks is None else token_window(ops.masks, t0, t0 + tile + halo)
        dz_k = [dz if masks is None else dz * plan.per_token(masks[k]) for k in range(plan.width)]

        # dx of the owned positions: [t0, t0+T), plus [-(K-1), 0) (dS) for the first tile.
        start = 0 if j == 0 else halo
        count = tile + halo - start
        padded = [plan.pad_left(d, halo) for d in dz_k]
        owned = _dx_tile(ops, padded, start, count)
        first = t0 - halo + start
        if final_parts:
            owned = owned + plan.load(final_parts, first, first + count).tile
        plan.store(owned, first, destinations)

        # Stage 1 of dw/db: partial sums over the owned tokens [t0, t0+T) only.
        partial = torch.stack(
            [
                plan.sum_time(plan.narrow(dz_k[k], 0, tile) * plan.narrow(local_x, k, tile))
                for k in range(plan.width)
            ]
            + [plan.sum_time(plan.narrow(dz, 0, tile))],
            dim=-1,
        )[:, : plan.dim]
        _accumulate_partials(workspace, partial, j, plan.n_time_tiles)

    # Stage 2: reduce the P groups in order, then round once to the parameter dtypes.
    reduced = workspace[0].clone()
    for group in range(1, groups):
        reduced += workspace[group]
    dweight = reduced[:, : plan.width].to(w_dtype)
    dbias = None if b_dtype is None else reduced[:, plan.width].to(b_dtype)
    return dx, dweight, dbias, dstate
