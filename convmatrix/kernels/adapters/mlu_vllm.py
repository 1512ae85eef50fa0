"""Adapter ``mlu_vllm``: torch_mlu_ops' vLLM-style ``causal_conv1d_fn`` as a canonical kernel.

The forward goes through ``convmatrix.kernels.adapters.vllm_style`` (token-major x,
``query_start_loc``, one cache line per sequence, its final state per sequence): the library's op
is a port of vLLM's, with the same API (``convmatrix.kernels.adapters.mlu_ops``). Declared: widths
2-4 (the library raises ``ValueError`` above 4), no backward, a final state per packed sequence.

The library has no backward and no vLLM-style update; a decode update runs as a forward of
the new tokens with the cached history as the initial state (``semantics.update_via_forward``
does the shifting / ring / slot bookkeeping of the canonical state).
"""

from __future__ import annotations

import torch

from convmatrix.kernels.adapters.mlu_ops import MluOps, load_mlu_ops, mlu_unavailable
from convmatrix.kernels.adapters.vllm_style import vllm_style_forward
from convmatrix.kernels.interface.protocol import FEATURES, Capabilities, ContractError, KernelBase
from convmatrix.kernels.interface.semantics import update_via_forward

__all__ = ["MluVllmKernel"]


class MluVllmKernel(KernelBase):
    """``MluVllmKernel()`` uses torch_mlu_ops; ``MluVllmKernel(ops)`` any implementation of
    the same API (``convmatrix.kernels.doubles.mlu_standin.STANDIN_OPS`` on CPU)."""

    capabilities = Capabilities(
        widths=frozenset({2, 3, 4}),
        features=FEATURES - {"backward"},
        final_state="per_sequence",
        error_types=(ValueError, AssertionError),
    )

    def __init__(self, ops: MluOps | None = None) -> None:
        self._ops, self._reason = (ops, None) if ops is not None else load_mlu_ops()
        self.name = "mlu_vllm" if ops is None else f"mlu_vllm[{ops.label}]"
        self.source_module = "torch_mlu_ops" if ops is None else ops.causal_conv1d.__module__

    def availability(self) -> str | None:
        return mlu_unavailable(self._ops, self._reason)

    def _fn(self):
        reason = self.availability()
        if reason:
            raise ContractError(f"{self.name} unavailable: {reason}")
        return self._ops.causal_conv1d_fn

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
        args = (x, weight, bias, initial_state, seq_idx, activation, self.capabilities.widths)
        return vllm_style_forward(self._fn(), *args, return_final_state)

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
        def forward(xl, w, b, history, act):
            return self.forward(xl, w, b, initial_state=history, activation=act)

        with torch.no_grad():
            return update_via_forward(
                forward, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )
