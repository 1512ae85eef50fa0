"""What the MLU adapters share: the torch_mlu_ops entry points and the varlen translation.

torch_mlu_ops (Cambricon's op library for torch_mlu) ships Triton causal conv1d ops. Verified
against its published Python sources (torch_mlu_ops 1.12.1+torch2.11.0, ``triton_ops.py``
and ``triton/conv/ops.py``):

- ``torch_mlu_ops.triton_ops.causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc,
  cache_indices=None, has_initial_state=None, activation="silu", pad_slot_id=-1, ...)``:
  vLLM-style, forward only; ``x`` is ``(dim, tokens)`` token-major (``x.stride(0) == 1``),
  sequences concatenated and delimited by ``query_start_loc`` ``(N+1,)``; sequence i reads
  its initial state from the *first* K-1 columns of ``conv_states[cache_indices[i]]``
  (``(lines, dim, >= K-1)`` with ``stride(1) == 1``) when ``has_initial_state[i]``, and
  writes its final state there in place; ``ValueError`` for widths above 4;
- ``torch_mlu_ops.triton_ops.causal_conv1d(x, weight, bias, residual, initial_state,
  output_final_state, activation, backend="triton", cu_seqlens=None, ...)``: fla-style, with
  backward (``CausalConv1dFunctionFla``); ``x`` ``(B, T, D)`` (``(1, total, D)`` with
  ``cu_seqlens``); ``initial_state`` ``(N, D, W)`` contiguous, of which the kernel reads the
  *last* W-1 columns; ``output_final_state=True`` raises ``ValueError``;
- ``torch_mlu_ops.triton.conv.causal_conv1d_update(x, cache, residual, weight, bias,
  activation) -> (y, cache)``: one token ``(N, D)`` against a ``(N, D, W)`` cache that is
  shifted left and gets the token in its last column, in place.

``MluOps`` bundles the three so that an adapter can run against the library or, on CPU,
against ``convmatrix.kernels.doubles.mlu_standin`` (the same APIs written from the reference).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from convmatrix.kernels.interface.protocol import ContractError

__all__ = ["MluOps", "SequenceRun", "load_mlu_ops", "mlu_unavailable", "runs_of", "token_major"]


@dataclass(frozen=True)
class MluOps:
    causal_conv1d_fn: Callable[..., Any]  # vLLM-style varlen forward
    causal_conv1d: Callable[..., Any]  # fla-style forward with backward
    causal_conv1d_update: Callable[..., Any]  # fla-style one-token update
    label: str = "torch_mlu_ops"


def load_mlu_ops() -> tuple[MluOps | None, str | None]:
    """(the library's ops, None) or (None, why not). Never raises."""
    try:
        triton_ops = importlib.import_module("torch_mlu_ops.triton_ops")
        conv = importlib.import_module("torch_mlu_ops.triton.conv")
        ops = MluOps(
            triton_ops.causal_conv1d_fn, triton_ops.causal_conv1d, conv.causal_conv1d_update
        )
    except Exception as exc:  # not installed, no torch_mlu, or an API that moved
        return None, f"torch_mlu_ops not importable: {type(exc).__name__}: {exc}"
    return ops, None


def mlu_unavailable(ops: MluOps | None, reason: str | None) -> str | None:
    """Availability of an adapter: the library must import and an MLU must be visible."""
    if ops is None:
        return reason
    if ops.label != "torch_mlu_ops":
        return None  # the in-project stand-in runs wherever torch does
    mlu = getattr(torch, "mlu", None)
    if mlu is None or not mlu.is_available():
        return "needs an MLU device (torch.mlu is missing or reports no device)"
    return None


@dataclass(frozen=True)
class SequenceRun:
    """A maximal run of one sequence id in one batch row: tokens ``[start, stop)``."""

    row: int
    start: int
    stop: int
    padding: bool

    @property
    def length(self) -> int:
        return self.stop - self.start


def runs_of(seq_idx: torch.Tensor | None, batch: int, seqlen: int) -> list[SequenceRun]:
    """Row-major runs of ``seq_idx`` (B, L): the sequences a varlen API sees, in token order
    of ``x`` flattened to (B*L) tokens. Without seq_idx every row is one sequence."""
    if seq_idx is None:
        return [SequenceRun(b, 0, seqlen, False) for b in range(batch)]
    runs = []
    for row, ids in enumerate(seq_idx.tolist()):
        start = 0
        for t in range(1, seqlen + 1):
            if t == seqlen or ids[t] != ids[start]:
                runs.append(SequenceRun(row, start, t, ids[start] < 0))
                start = t
    return runs


def boundaries(runs: list[SequenceRun], seqlen: int, device: torch.device) -> torch.Tensor:
    """``query_start_loc`` / ``cu_seqlens``: (N+1,) int32 offsets into the flattened tokens."""
    starts = [r.row * seqlen + r.start for r in runs] + [runs[-1].row * seqlen + runs[-1].stop]
    return torch.tensor(starts, dtype=torch.int32, device=device)


def token_major(x: torch.Tensor) -> torch.Tensor:
    """(B, C, L) → (B*L, C) tokens, a view for dense channel-last x, else one copy."""
    batch, dim, seqlen = x.shape
    return x.permute(0, 2, 1).reshape(batch * seqlen, dim)


def check_final_state(runs: list[SequenceRun], width: int, batch: int) -> None:
    """A varlen API's final state is its last sequence's; the canonical F is the row's last
    K-1 inputs across sequences. They agree when the last run of a packed row is the whole
    row or at least K-1 long."""
    last = {}
    for run in runs:
        last[run.row] = run
    for row in range(batch):
        run = last[row]
        if run.start > 0 and run.length < width - 1:
            raise ContractError(
                f"row {row}: last sequence has {run.length} < K-1 = {width - 1} tokens; "
                "a varlen API's final state does not reach into the previous sequence"
            )
