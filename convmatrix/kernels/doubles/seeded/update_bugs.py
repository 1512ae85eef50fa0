"""Seeded bugs of the decode update: where the history is read from and written to (ring,
slots, pad slots, neighbouring rows), which window the new tokens see, and the bias."""

from __future__ import annotations

from typing import Any

import torch

from convmatrix.kernels.doubles.seeded.base import Bug, SeededKernel
from convmatrix.kernels.interface.semantics import decode_prefix, write_decode_state

__all__ = ["UPDATE_BUGS"]

UPDATE = {"op": "update"}


def _update_args(kwargs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**kwargs, **changes}


class UpdateStaleOutput(SeededKernel):
    """Dao-AILab/causal-conv1d ROCm port, commit 018489d: the update's kernel dispatch was
    commented out; it returned the freshly allocated output and never wrote conv_state."""

    bug = Bug(
        "update_stale_output", "update not launched", "update", "Dao 018489d",
        UPDATE, None, "any update case",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        return torch.zeros_like(x)


class SlotIndexIgnored(SeededKernel):
    """``state_indices`` ignored: batch row b uses pool row b (continuous batching broken)."""

    bug = Bug(
        "slot_index_ignored", "slot indexing", "update", "seed table",
        {**UPDATE, "slots": "permuted"}, {**UPDATE, "slots": "identity"}, "slots permuted",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        idx = kwargs.get("state_indices")
        if idx is not None:
            kwargs = _update_args(kwargs, state_indices=torch.arange(len(idx), dtype=idx.dtype))
        return super().update(x, conv_state, weight, bias, **kwargs)


class PadSlotWritten(SeededKernel):
    """A pad slot id (-1) is used as an index: Python-style it names the pool's last row,
    which the update then reads and overwrites (vLLM PR #34685's suspected failure mode)."""

    bug = Bug(
        "pad_slot_written", "pad slot", "update", "seed table",
        {**UPDATE, "slots": "permuted_pad"}, {**UPDATE, "slots": "permuted"},
        "slots permuted_pad",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        idx = kwargs.get("state_indices")
        if idx is not None:
            last = torch.full_like(idx, conv_state.shape[0] - 1)
            kwargs = _update_args(kwargs, state_indices=torch.where(idx < 0, last, idx))
        return super().update(x, conv_state, weight, bias, **kwargs)


class NeighbourRowTouched(SeededKernel):
    """The state write is one row long: each live slot also writes column 0 of the next pool
    row (a row stride off by one), a row the call must not touch."""

    bug = Bug(
        "neighbour_row_touched", "in-place update bounds", "update", "seed table",
        UPDATE, None, "any update case (guards on untouched rows)",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        y = super().update(x, conv_state, weight, bias, **kwargs)
        idx = kwargs.get("state_indices")
        rows = range(x.shape[0]) if idx is None else [int(r) for r in idx.tolist() if r >= 0]
        for row in rows:
            if row + 1 < conv_state.shape[0]:
                conv_state[row + 1, :, 0] = conv_state[row, :, -1]
        return y


def _ring_read_unwrapped(state: torch.Tensor, width: int, seqlens: torch.Tensor | None):  # type: ignore[no-untyped-def]
    if seqlens is None:
        return decode_prefix(state, width, None)
    rows, dim, size = state.shape
    cols = seqlens.long()[:, None] + torch.arange(-(width - 1), 0, device=state.device)
    cols = torch.where(cols < 0, cols + size, cols)  # wraps below 0 only
    inside = cols < size
    got = torch.gather(state, 2, cols.clamp(max=size - 1)[:, None, :].expand(rows, dim, width - 1))
    return got * inside[:, None, :].to(got.dtype)  # masked load past the end reads 0


def _ring_write_unwrapped(state: torch.Tensor, x: torch.Tensor, seqlens: torch.Tensor | None):  # type: ignore[no-untyped-def]
    if seqlens is None:
        return write_decode_state(state, x, None)
    new, size = state.clone(), state.shape[2]
    for r, start in enumerate(seqlens.long().tolist()):
        for t in range(x.shape[2]):
            if start + t < size:  # masked store past the end is dropped
                new[r, :, start + t] = x[r, :, t].to(new.dtype)
    return new


class RingNoModulo(SeededKernel):
    """Ring-buffer positions computed without ``% S``: loads past the end read 0 and stores
    past the end are masked away (the usual Triton masks hide the overflow)."""

    bug = Bug(
        "ring_no_modulo", "ring index", "update", "seed table",
        {**UPDATE, "circular": True, "tokens": 3, "steps": 2, "state_len": 4},
        {**UPDATE, "circular": False, "tokens": 3, "steps": 2, "state_len": 4},
        "circular with tokens*steps wrapping past S",
    )  # fmt: skip

    read_history = staticmethod(_ring_read_unwrapped)
    write_history = staticmethod(_ring_write_unwrapped)


class RingIgnored(SeededKernel):
    """sgl-project/sglang #38622 / PR #38623 (b): ``cache_seqlens`` declared but never read;
    the state is shifted linearly instead of used as a ring."""

    bug = Bug(
        "ring_ignored", "ring index", "update", "sglang #38622",
        {**UPDATE, "circular": True}, {**UPDATE, "circular": False}, "circular true",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        return super().update(
            x, conv_state, weight, bias, **_update_args(kwargs, cache_seqlens=None)
        )


def _window_head(state: torch.Tensor, width: int, seqlens: torch.Tensor | None):  # type: ignore[no-untyped-def]
    if seqlens is not None:
        return decode_prefix(state, width, seqlens)
    return state[:, :, : width - 1]


class StateWindowHead(SeededKernel):
    """sgl-project/sglang #38622 (a): with ``state_len > K-1`` the update reads the first K-1
    state entries instead of the trailing window."""

    bug = Bug(
        "state_window_head", "state window", "update", "sglang #38622",
        {**UPDATE, "state_len": 6}, {**UPDATE, "state_len": 3}, "state_len > K-1",
    )  # fmt: skip

    read_history = staticmethod(_window_head)


class UpdateReadAfterWrite(SeededKernel):
    """sgl-project/sglang #16714 / PR #16899 and NVIDIA/TensorRT-LLM #17522 / PR #17539: the
    ordering barriers were commented out, so the history is read after the same cells were
    overwritten: every output sees a window already advanced by the new tokens."""

    bug = Bug(
        "update_read_after_write", "read-after-overwrite race", "update", "sglang #16714",
        UPDATE, {**UPDATE, "circular": True}, "any linear (non-ring) update case",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("cache_seqlens") is not None:
            return super().update(x, conv_state, weight, bias, **kwargs)
        ahead = conv_state.clone()
        super().update(x, ahead, weight, bias, **kwargs)
        y = super().update(x, ahead.clone(), weight, bias, **kwargs)
        conv_state.copy_(ahead)
        return y


class UpdateBiasIgnored(SeededKernel):
    """modelscope/twinkle PR #228 (review finding): the update kernel never read ``bias_ptr``;
    decode outputs miss the bias (the forward is right)."""

    bug = Bug(
        "update_bias_ignored", "bias in one path", "update", "twinkle #228",
        UPDATE, {**UPDATE, "bias": False}, "update with bias",
    )  # fmt: skip

    def update_forward(self, xl, w, b, history, act):  # type: ignore[no-untyped-def]
        return super().update_forward(xl, w, None, history, act)


class Batch1Squeeze(SeededKernel):
    """fla-org/flash-linear-attention commit 8797def ("Fix batches of only 1 token"): decode
    did ``x.squeeze()``, which also drops the batch axis when B = 1 and T = 1."""

    bug = Bug(
        "batch1_squeeze", "shape squeeze", "batch B", "fla 8797def",
        {**UPDATE, "batch": 1, "tokens": 1}, {**UPDATE, "batch": 2, "tokens": 1},
        "update with batch 1 and tokens 1",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        x = x.squeeze()
        if x.dim() == 2 and x.shape[0] != 1:
            x = x.unsqueeze(-1)  # (C, 1): C rows of one channel
        return super().update(x, conv_state, weight, bias, **kwargs)


class StateWritePastEnd(SeededKernel):
    """The state write covers S+1 columns: one element past each row of conv_state is
    written (the next channel's first column, or the gap after the row)."""

    bug = Bug(
        "state_write_past_end", "write past the output", "update", "seed table",
        UPDATE, None, "any update case",
    )  # fmt: skip

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[no-untyped-def]
        y = super().update(x, conv_state, weight, bias, **kwargs)
        pool, dim, size = conv_state.shape
        longer = conv_state.as_strided((pool, dim, size + 1), conv_state.stride())
        idx = kwargs.get("state_indices")
        rows = list(range(x.shape[0])) if idx is None else [int(r) for r in idx.tolist() if r >= 0]
        longer[rows, :, size] = conv_state[rows, :, size - 1]
        return y


class UpdateMultiTokenWindow(SeededKernel):
    """A multi-token update gives every new token the window of the first one: token t does
    not see tokens 0..t-1 of the same call."""

    bug = Bug(
        "update_multi_token_window", "multi-token window", "update", "seed table",
        {**UPDATE, "tokens": 3}, {**UPDATE, "tokens": 1}, "update tokens > 1",
    )  # fmt: skip

    def update_forward(self, xl, w, b, history, act):  # type: ignore[no-untyped-def]
        step = super().update_forward
        return torch.cat(
            [step(xl[..., t : t + 1], w, b, history, act) for t in range(xl.shape[2])], dim=2
        )


UPDATE_BUGS: tuple[type[SeededKernel], ...] = (
    UpdateStaleOutput,
    SlotIndexIgnored,
    PadSlotWritten,
    NeighbourRowTouched,
    RingNoModulo,
    RingIgnored,
    StateWindowHead,
    UpdateReadAfterWrite,
    UpdateBiasIgnored,
    Batch1Squeeze,
    StateWritePastEnd,
    UpdateMultiTokenWindow,
)
