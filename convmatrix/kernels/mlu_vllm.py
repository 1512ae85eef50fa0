"""Adapter ``mlu_vllm``: torch_mlu_ops' vLLM-style ``causal_conv1d_fn`` as a canonical kernel.

Translation of a canonical forward (``convmatrix.kernels.mlu_ops`` has the API):

- x (B, C, L) → token-major ``(C, B*L)`` (``stride(0) == 1``; a view for dense channel-last
  x), every batch row split into its sequences (runs of ``seq_idx``), delimited by
  ``query_start_loc``;
- one cache line per sequence, ``(N, C, K-1)`` laid out with ``stride(1) == 1`` in x's dtype
  (the library computes in the state dtype); the initial state goes to the line of the first
  sequence of its row (``has_initial_state``), the library reads the line's first K-1
  columns, so the canonical state is copied unshifted;
- the output ``(C, B*L)`` is viewed back as (B, C, L) (channel-last strides); padding tokens
  (own sequences, never given a state) are zeroed here, as docs/spec.md §2 asks;
- the final state is the line of each row's last sequence after the call (written by the
  library in place); it equals the canonical F when that sequence is the whole row or has at
  least K-1 tokens, else the case is outside this API's contract.

The library has no backward and no vLLM-style update; a decode update runs as a forward of
the new tokens with the cached history as the initial state (``semantics.update_via_forward``
does the shifting / ring / slot bookkeeping of the canonical state).
"""

from __future__ import annotations

import torch

from convmatrix.core.case import Case
from convmatrix.kernels.mlu_ops import (
    MluOps,
    boundaries,
    check_final_state,
    load_mlu_ops,
    mlu_unavailable,
    runs_of,
    token_major,
)
from convmatrix.kernels.protocol import FEATURES, Capabilities, ContractError, KernelBase
from convmatrix.kernels.semantics import check_forward_args, update_via_forward

__all__ = ["MluVllmKernel", "standin"]


class MluVllmKernel(KernelBase):
    """``MluVllmKernel()`` uses torch_mlu_ops; ``MluVllmKernel(ops)`` any implementation of
    the same API (``convmatrix.kernels.mlu_standin.STANDIN_OPS`` on CPU)."""

    capabilities = Capabilities(
        widths=frozenset({2, 3, 4}),
        features=FEATURES - {"backward"},
        error_types=(ValueError, AssertionError),
    )

    def __init__(self, ops: MluOps | None = None) -> None:
        self._ops, self._reason = (ops, None) if ops is not None else load_mlu_ops()
        self.name = "mlu_vllm" if ops is None else f"mlu_vllm[{ops.label}]"

    def availability(self) -> str | None:
        return mlu_unavailable(self._ops, self._reason)

    def contract_violation(self, case: Case) -> str | None:
        reason = self.capabilities.contract_violation(case)
        if reason or not (case.final_state and case.seq_lens and len(case.seq_lens) > 1):
            return reason
        if abs(case.seq_lens[-1]) < case.width - 1:
            return "packed row ends in a sequence shorter than K-1: its final state is per-sequence"
        return None

    def _call(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        initial_state: torch.Tensor | None,
        seq_idx: torch.Tensor | None,
        activation: str | None,
    ) -> tuple[torch.Tensor, torch.Tensor, list]:
        """(y (B, C, L), cache lines (N, C, K-1), runs)."""
        reason = self.availability()
        if reason:
            raise ContractError(f"{self.name} unavailable: {reason}")
        batch, dim, seqlen, width = check_forward_args(
            x, weight, bias, initial_state, seq_idx, activation
        )
        if width not in self.capabilities.widths:
            raise ContractError(f"width {width} not in [2, 3, 4]")
        runs = runs_of(seq_idx, batch, seqlen)
        lines = x.new_zeros(len(runs), width - 1, dim).transpose(1, 2)
        has_state = torch.zeros(len(runs), dtype=torch.bool, device=x.device)
        if initial_state is not None:
            for i, run in enumerate(runs):
                if run.start == 0 and not run.padding:
                    lines[i] = initial_state[run.row]
                    has_state[i] = True
        out = self._ops.causal_conv1d_fn(
            token_major(x).t(),
            weight,
            bias,
            lines,
            boundaries(runs, seqlen, x.device),
            cache_indices=torch.arange(len(runs), dtype=torch.int32, device=x.device),
            has_initial_state=has_state,
            activation=activation,
            pad_slot_id=-1,
        )
        y = out.t().reshape(batch, seqlen, dim).permute(0, 2, 1)
        if seq_idx is not None:
            y = y * (seq_idx.to(x.device) >= 0)[:, None, :].to(y.dtype)
        return y, lines, runs

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
        with torch.no_grad():  # forward only: no autograd graph through the library
            y, lines, runs = self._call(x, weight, bias, initial_state, seq_idx, activation)
        if not return_final_state:
            return y
        check_final_state(runs, weight.shape[1], x.shape[0])
        last = {run.row: i for i, run in enumerate(runs)}  # the row's last sequence
        final = lines[[last[b] for b in range(x.shape[0])]]
        return y, final.to(x.dtype)

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
            return self._call(xl, w, b, history, None, act)[0]

        with torch.no_grad():
            return update_via_forward(
                forward, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )


def standin() -> MluVllmKernel:
    """The adapter over the in-project stand-in of the API (runs on CPU)."""
    from convmatrix.kernels.mlu_standin import STANDIN_OPS

    return MluVllmKernel(STANDIN_OPS)
