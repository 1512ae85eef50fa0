"""Correct kernels with narrow declared contracts, each refusing (``ContractError``) every call
outside what it declares: the harness must never make such a call on its own accord
(tests/test_applicability.py). Each is the ``torch`` framework path plus its refusal.

Import them as ``--kernel contract_kernels:NAME`` with this directory on ``PYTHONPATH``.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.protocol import FEATURES, STATE_LEN_K, Capabilities, ContractError

# FailsOnShortCalls raises on forward calls shorter than this many tokens.
SHORT = 12


class RejectsPackedFinalState(TorchKernel):
    """Like Dao's interface: ``seq_idx`` with a returned final state is refused."""

    name = "rejects_packed_final"
    capabilities = Capabilities(final_state="unpacked", intermediate="input")

    def forward(self, x, weight, bias=None, **kwargs):
        if kwargs.get("seq_idx") is not None and kwargs.get("return_final_state"):
            raise ContractError("seq_idx with return_final_state")
        return super().forward(x, weight, bias, **kwargs)


class StateLenK(TorchKernel):
    """Like fla's cache: a decode state of exactly K columns, every other length refused."""

    name = "state_len_k"
    capabilities = Capabilities(state_lens=STATE_LEN_K, intermediate="input")

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        if conv_state.shape[2] != weight.shape[1]:
            raise ContractError(f"state_len {conv_state.shape[2]} != K = {weight.shape[1]}")
        return super().update(x, conv_state, weight, bias, **kwargs)


class NoSlots(TorchKernel):
    """No continuous batching: any ``state_indices`` is refused."""

    name = "no_slots"
    capabilities = Capabilities(features=FEATURES - {"slot_indices"}, intermediate="input")

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        if kwargs.get("state_indices") is not None:
            raise ContractError("no state_indices here")
        return super().update(x, conv_state, weight, bias, **kwargs)


class NullBlockZero(TorchKernel):
    """vLLM's convention: slot id 0 (the null block) marks a padding row; negative ids are
    refused (vLLM would read before the pool)."""

    name = "null_block_zero"
    capabilities = Capabilities(pad_slot_id=0, intermediate="input")

    def update(self, x, conv_state, weight, bias=None, *, state_indices=None, **kwargs):
        if state_indices is not None:
            if bool((state_indices < 0).any()):
                raise ContractError("negative slot id (padding is slot 0 here)")
            state_indices = torch.where(state_indices == 0, -1, state_indices)
        return super().update(x, conv_state, weight, bias, state_indices=state_indices, **kwargs)


class NullBlockIgnored(TorchKernel):
    """Declares the null-block convention but treats slot 0 as a live row: it writes the
    reserved row and gives padding rows outputs (a wrong kernel, for the guards to catch)."""

    name = "null_block_ignored"
    capabilities = Capabilities(pad_slot_id=0, intermediate="input")


class WritesYIntoX(TorchKernel):
    """Like vLLM's update at 533d337 (``out = x``): y is written into x's buffer, declared."""

    name = "y_into_x"
    capabilities = Capabilities(inplace_y=frozenset({"update"}), intermediate="input")

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        y = super().update(x, conv_state, weight, bias, **kwargs)
        x.copy_(y)
        return x


class WritesYIntoXUndeclared(WritesYIntoX):
    """The same, without declaring it: x's change is a guard violation."""

    name = "y_into_x_undeclared"
    capabilities = Capabilities(intermediate="input")


class FailsOnShortCalls(TorchKernel):
    """Raises RuntimeError on a forward of fewer than SHORT tokens (a chunk of a property)."""

    name = "fails_short"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] < SHORT:
            raise RuntimeError(f"launch failed for {x.shape[-1]} tokens")
        return super().forward(x, weight, bias, **kwargs)
