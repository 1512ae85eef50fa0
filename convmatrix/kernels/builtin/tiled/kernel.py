"""The ``tiled`` kernel: the seed's MLU design, vectorised per tile with torch, on any device.

It is the prototype an engineer writes before the BANG C version: the forward of
``tiled.forward``, the backward of ``tiled.backward`` (wired into autograd here, so the
backward under test is the tiled design and not torch's autograd of the forward), and the
decode update as a forward over the new tokens with the cached history as the left halo.
Inputs fp32/fp16/bf16 in any strides, FP32 accumulation, outputs in x's dtype (dw/db in the
weight/bias dtype, dS in the state's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from convmatrix.kernels.builtin.tiled.backward import backward_tiles, tiled_backward
from convmatrix.kernels.builtin.tiled.forward import forward_tiles, prepare, tiled_forward
from convmatrix.kernels.builtin.tiled.geometry import (
    DEFAULT_GEOMETRY,
    geometry_from_env,
    make_geometry,
)
from convmatrix.kernels.interface.corecall import CoreArgs, CoreCall, update_history
from convmatrix.kernels.interface.protocol import Capabilities, Geometry, KernelBase
from convmatrix.kernels.interface.semantics import (
    check_forward_args,
    decode_prefix,
    is_silu,
    update_via_forward,
    write_decode_state,
)

__all__ = ["TiledFunction", "TiledKernel"]


class TiledFunction(torch.autograd.Function):
    """Autograd node whose backward is ``tiled_backward`` (recomputing z from the inputs)."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, seq_idx, activation, geometry):  # type: ignore[override]
        silu = is_silu(activation)
        y, final = tiled_forward(x, weight, bias, initial_state, seq_idx, silu, geometry)
        ctx.save_for_backward(x, weight, bias, initial_state, seq_idx)
        ctx.silu, ctx.geometry = silu, geometry
        return y, final

    @staticmethod
    def backward(ctx, grad_y, grad_final):  # type: ignore[override]
        x, weight, bias, initial_state, seq_idx = ctx.saved_tensors
        dx, dweight, dbias, dstate = tiled_backward(
            x, weight, bias, initial_state, seq_idx, ctx.silu, ctx.geometry, grad_y, grad_final
        )
        need = ctx.needs_input_grad
        return (
            dx if need[0] else None,
            dweight if need[1] else None,
            dbias if need[2] else None,
            dstate if need[3] else None,
            None,
            None,
            None,
        )


def _label(geometry: Geometry) -> str:
    if geometry == DEFAULT_GEOMETRY:
        return "tiled"
    return (
        f"tiled(T={geometry.time_tile},C_t={geometry.channel_tile},"
        f"vec={geometry.vector_width},P={geometry.partial_groups})"
    )


class TiledKernel(KernelBase):
    """The tiled MLU-design port. ``TiledKernel(T=128, P=2)`` or ``TiledKernel(geometry)``;
    without arguments the geometry comes from ``CONVMATRIX_TILED_GEOMETRY`` or the default
    ``T=64, C_t=32, vec=8, P=4``."""

    def __init__(self, geometry: Geometry | None = None, **overrides: int) -> None:
        base = geometry if geometry is not None else geometry_from_env()
        self.geometry = make_geometry(base, **overrides)
        self.capabilities = Capabilities(geometry=self.geometry)
        self.name = _label(self.geometry)

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        initial_state: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        return_final_state: bool = False,
        activation: str | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_forward_args(x, weight, bias, initial_state, seq_idx, activation)
        y, final = TiledFunction.apply(
            x, weight, bias, initial_state, seq_idx, activation, self.geometry
        )
        return (y, final) if return_final_state else y

    def update(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        activation: str | None = None,
        cache_seqlens: torch.Tensor | None = None,
        state_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each live row's K-1 newest cached tokens (shift or ring order, from its slot) are
        the left halo of one tiled forward over the new tokens; the state is then written
        in place: shifted, or the ring columns ``(cache_seqlens + t) % S``."""

        with torch.no_grad():
            return update_via_forward(
                self.update_forward,
                x,
                conv_state,
                weight,
                bias,
                activation,
                cache_seqlens,
                state_indices,
                read=self.read_history,
                write=self.write_history,
            )

    # The update's three steps, methods so that a variant (the seeded-bug kernels of
    # ``convmatrix.kernels.doubles.seeded``) can replace one of them.
    read_history = staticmethod(decode_prefix)
    write_history = staticmethod(write_decode_state)

    def update_forward(self, xl, w, b, history, act):  # type: ignore[no-untyped-def]
        """The forward over the new tokens with ``history`` (K-1 newest cached) as the state."""
        return tiled_forward(xl, w, b, history, None, is_silu(act), self.geometry)[0]

    def core_call(self, args: CoreArgs) -> CoreCall:
        """The tile loops alone (``convmatrix.kernels.interface.corecall``): ``prepare`` (FP32
        weights padded to whole channel tiles, packed masks) runs now; autograd and argument checks
        are left out. Backward includes its workspace zeroing and second-stage reduction."""
        x, initial_state = args.x, args.initial_state
        if args.op == "update":
            x, initial_state = update_history(args)
        ops = prepare(x, args.weight, args.bias, initial_state, args.seq_idx, self.geometry)
        dtypes = (x.dtype, args.weight.dtype, None if args.bias is None else args.bias.dtype)

        def forward() -> Any:
            return forward_tiles(ops, x.dtype, args.silu, initial_state)

        def backward() -> Any:
            assert args.grad_y is not None, "backward core calls need grad_y"
            return backward_tiles(
                ops, dtypes, initial_state, args.silu, self.geometry, args.grad_y, args.grad_final
            )

        if args.op == "fwd_bwd":
            return lambda: (forward(), backward())
        return backward if args.op == "bwd" else forward

    def describe(self) -> Mapping[str, Any]:
        return {
            **super().describe(),
            "tile_shapes": "stride(2)==1: [C_t, T+K-1] rows; stride(1)==1: [T+K-1, C_t]",
            "backward": "dx by output ownership (right halo of dy); dw/db via P FP32 groups",
            "workspace_bytes": "4*P*C*(K+1)",
        }
