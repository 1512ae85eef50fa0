"""Adapter ``mlu_fla``: torch_mlu_ops' fla-style ``causal_conv1d`` (with backward) and its
one-token ``causal_conv1d_update``, as a canonical kernel (API in
``convmatrix.kernels.adapters.mlu_ops``).

Translation:

- x (B, C, L) → ``x.transpose(1, 2)``, the (B, T, D) view the op takes (no copy); packed rows
  become ``(1, B*L, D)`` with ``cu_seqlens`` over the runs of ``seq_idx``;
- the canonical state (B, C, K-1) becomes the op's ``(N, D, W)``: the op reads the *last* W-1
  columns, so the state goes to columns 1..K-1 and column 0 is zero (its gradient is dropped
  on the way back); with packing only the first sequence of a row gets it;
- the output (B, T, D) is viewed back as (B, C, L); padding tokens are zeroed here (their
  gradients then vanish through autograd);
- final states are not offered (``output_final_state=True`` raises in the library), so cases
  that need them are skipped, not failed;
- decode: the history becomes the ``(rows, D, W)`` cache the update op shifts in place, one
  call per new token (the cache it wrote feeds the next token); the canonical state's shift /
  ring / slot bookkeeping is ``semantics.update_via_forward``'s.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.adapters.mlu_ops import (
    MluOps,
    boundaries,
    load_mlu_ops,
    mlu_unavailable,
    runs_of,
    token_major,
)
from convmatrix.kernels.interface.protocol import Capabilities, ContractError, KernelBase
from convmatrix.kernels.interface.semantics import check_forward_args, update_via_forward

__all__ = ["MluFlaKernel"]


def _wide_state(states: torch.Tensor, width: int) -> torch.Tensor:
    """(N, C, K-1) → (N, C, K) contiguous with a zero column 0 (the op reads columns 1..K-1)."""
    pad = states.new_zeros(states.shape[0], states.shape[1], 1)
    return torch.cat([pad, states], dim=2).contiguous()


class MluFlaKernel(KernelBase):
    """``MluFlaKernel()`` uses torch_mlu_ops; ``MluFlaKernel(ops)`` another implementation."""

    capabilities = Capabilities(final_state="none", error_types=(ValueError, AssertionError))

    def __init__(self, ops: MluOps | None = None) -> None:
        self._ops, self._reason = (ops, None) if ops is not None else load_mlu_ops()
        self.name = "mlu_fla" if ops is None else f"mlu_fla[{ops.label}]"
        self.source_module = "torch_mlu_ops" if ops is None else ops.causal_conv1d.__module__

    def availability(self) -> str | None:
        return mlu_unavailable(self._ops, self._reason)

    def _require(self) -> MluOps:
        reason = self.availability()
        if reason:
            raise ContractError(f"{self.name} unavailable: {reason}")
        return self._ops

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
        ops = self._require()
        batch, dim, seqlen, width = check_forward_args(
            x, weight, bias, initial_state, seq_idx, activation
        )
        if return_final_state:
            raise ContractError("torch_mlu_ops causal_conv1d has no final state output")
        state = None if initial_state is None else initial_state.to(x.dtype)
        if seq_idx is None:
            init = None if state is None else _wide_state(state, width)
            y, _ = ops.causal_conv1d(
                x.transpose(1, 2), weight, bias, initial_state=init, activation=activation
            )
            return y.transpose(1, 2)
        runs = runs_of(seq_idx, batch, seqlen)
        init = None
        if state is not None:
            firsts = [i for i, r in enumerate(runs) if r.start == 0 and not r.padding]
            rows = [runs[i].row for i in firsts]
            narrow = state.new_zeros(len(runs), dim, width - 1)
            narrow = narrow.index_copy(0, torch.tensor(firsts, device=x.device), state[rows])
            init = _wide_state(narrow, width)
        y, _ = ops.causal_conv1d(
            token_major(x)[None],
            weight,
            bias,
            initial_state=init,
            activation=activation,
            cu_seqlens=boundaries(runs, seqlen, x.device),
        )
        live = (seq_idx.to(x.device) >= 0).to(y.dtype)
        return (y.reshape(batch, seqlen, dim) * live[:, :, None]).transpose(1, 2)

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
        ops = self._require()

        def forward(xl, w, b, history, act):
            cache = _wide_state(history.to(xl.dtype), w.shape[1])
            ys = []
            for t in range(xl.shape[2]):
                y, cache = ops.causal_conv1d_update(xl[:, :, t], cache, None, w, b, act)
                ys.append(y)
            return torch.stack(ys, dim=2)

        with torch.no_grad():
            return update_via_forward(
                forward, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )
