"""The convmatrix kernel object of the plugin: declares the contract, calls the custom op.

convmatrix finds it through the entry point ``my_mlu`` (pyproject.toml), so after
``pip install .`` it works with ``convmatrix kernels`` and ``convmatrix run --kernel my_mlu``.
"""

from __future__ import annotations

import torch

from convmatrix.kernels import Capabilities, ContractError, Geometry, KernelBase
from convmatrix.kernels.interface.semantics import check_forward_args, update_via_forward
from my_mlu_conv.ops import register_mlu

__all__ = ["MyMluKernel"]

_ON_MLU = register_mlu()


def _conv(x, weight, bias, state, activation):
    silu = activation in ("silu", "swish")
    return torch.ops.my_mlu_conv.causal_conv1d_fwd(x, weight, bias, state, silu)


class MyMluKernel(KernelBase):
    """Declares what the kernel supports so the matrix files the rest as expected errors
    (widths) or skips (features); the geometry makes ``tile+1`` etc. hit its real tiles."""

    name = "my_mlu"
    capabilities = Capabilities(
        widths=frozenset({2, 3, 4}),
        features=frozenset({"initial_state", "update", "ring_buffer", "slot_indices"}),
        geometry=Geometry(time_tile=128, channel_tile=64, vector_width=16, partial_groups=4),
    )

    def describe(self):
        implementation = "BANG C (mlu)" if _ON_MLU else "portable tap loop"
        return {**super().describe(), "implementation": implementation}

    def forward(
        self,
        x,
        weight,
        bias=None,
        *,
        initial_state=None,
        seq_idx=None,
        return_final_state=False,
        activation=None,
    ):
        width = check_forward_args(x, weight, bias, initial_state, seq_idx, activation)[3]
        if width not in self.capabilities.widths:
            raise ContractError(f"width {width} not in [2, 3, 4]")
        if seq_idx is not None or return_final_state:
            raise ContractError("my_mlu supports neither seq_idx nor final states")
        return _conv(x, weight, bias, initial_state, activation)

    def update(
        self,
        x,
        conv_state,
        weight,
        bias=None,
        *,
        activation=None,
        cache_seqlens=None,
        state_indices=None,
    ):
        with torch.no_grad():
            return update_via_forward(
                _conv, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )
