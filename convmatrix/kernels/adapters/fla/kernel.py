"""``FlaKernel``: fla's Triton causal conv1d under the canonical protocol (the package
docstring has the API and the translation; ``loading`` how fla is found and prepared).

The contract depends on the fla that loads: flash-linear-attention 0.2.2-0.3.0's
``causal_conv1d`` takes no state (no ``initial_state``/``output_final_state``; their
``ShortConvolution`` keeps the cache outside the kernel), so those releases declare neither
state feature and one token per update. ``capabilities`` is therefore read from what loaded,
on first use (importing fla under the interpreter takes seconds, so never at construction).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from convmatrix.kernels.adapters import triton_interpreter
from convmatrix.kernels.adapters.fla.loading import INTERPRETER_BD, Loaded, load
from convmatrix.kernels.adapters.mlu_ops import boundaries, check_final_state, runs_of, token_major
from convmatrix.kernels.interface.protocol import (
    FEATURES,
    STATE_LEN_K,
    Capabilities,
    ContractError,
    Geometry,
    KernelBase,
)
from convmatrix.kernels.interface.semantics import check_forward_args, check_update_args

__all__ = ["FlaKernel"]

_MISSING = frozenset({"ring_buffer", "slot_indices"})
_STATES = frozenset({"initial_state", "final_state"})


def _wide(state: torch.Tensor) -> torch.Tensor:
    """(N, C, K-1) → fla's (N, C, K): a zero column 0 (never read), contiguous."""
    return torch.cat([state.new_zeros(state.shape[0], state.shape[1], 1), state], dim=2)


def _capabilities(loaded: Loaded) -> Capabilities:
    """The contract of the fla that loaded; of the newest fla (interpreted where there is no
    CUDA) when none did, so that cases still expand and say why they are skipped."""
    states = loaded.api is None or loaded.api.states
    interpreted = loaded.interpreted
    if loaded.api is None:
        interpreted = not torch.cuda.is_available() or triton_interpreter.interpreting()
    return Capabilities(
        features=FEATURES - _MISSING - (frozenset() if states else _STATES),
        geometry=Geometry(
            time_tile=loaded.time_tile if loaded.api else 64,
            channel_tile=INTERPRETER_BD if interpreted else None,
        ),
        state_lens=STATE_LEN_K,  # fla's decode cache is (N, D, W)
        max_update_tokens=None if states else 1,  # several tokens go through the forward
        final_state="per_sequence" if states else "none",
        intermediate="input",  # Triton computes in the input dtype (bound model)
    )


class FlaKernel(KernelBase):
    """fla's Triton causal conv1d, from fla-core or a checkout on ``PYTHONPATH``."""

    name = "fla"
    source_module = "fla"

    def __init__(self) -> None:
        self._capabilities: Capabilities | None = None

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        if self._capabilities is None:
            self._capabilities = _capabilities(load())
        return self._capabilities

    def availability(self) -> str | None:
        return load().reason

    def _loaded(self) -> Loaded:
        loaded = load()
        if loaded.reason:
            raise ContractError(f"fla unavailable: {loaded.reason}")
        return loaded

    def describe(self) -> Mapping[str, Any]:
        loaded = load()
        return {
            **super().describe(),
            **loaded.facts,
            "interpreter": loaded.interpreted,
            "unavailable": loaded.reason,
        }

    def _conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        state: torch.Tensor | None,
        want_final: bool,
        activation: str | None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fla's ``causal_conv1d`` on token-major ``x``; (y, final state or None)."""
        loaded = self._loaded()
        call = loaded.functions.causal_conv1d
        kwargs: dict[str, Any] = {"bias": bias, "activation": activation, "cu_seqlens": cu_seqlens}
        if not loaded.api.states:
            if state is not None or want_final:  # the contract keeps such calls away
                raise ContractError("this fla's causal_conv1d takes no state")
            return call(x, weight, **kwargs), None
        y, final = call(x, weight, initial_state=state, output_final_state=want_final, **kwargs)
        return y, final

    # -- calls -------------------------------------------------------------------------------
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
        batch, dim, seqlen, width = check_forward_args(
            x, weight, bias, initial_state, seq_idx, activation
        )
        if seq_idx is None:
            state = None if initial_state is None else _wide(initial_state)
            y, final = self._conv(
                x.transpose(1, 2), weight, bias, state, return_final_state, activation
            )
            y = y.transpose(1, 2)
            return (y, final[:, :, 1:]) if return_final_state else y
        runs = runs_of(seq_idx, batch, seqlen)
        if return_final_state:
            check_final_state(runs, width, batch)
        init = None
        if initial_state is not None:  # to each row's first run, unless it is padding
            rows = torch.tensor([r.row for r in runs], device=x.device)
            first = [r.start == 0 and not r.padding for r in runs]
            keep = torch.tensor(first, dtype=initial_state.dtype, device=x.device)
            # a product, not a scatter: dS stays defined (zero) when no run takes the state
            init = _wide(initial_state.index_select(0, rows) * keep[:, None, None])
        cu_seqlens = boundaries(runs, seqlen, x.device)
        y, final = self._conv(
            token_major(x)[None], weight, bias, init, return_final_state, activation, cu_seqlens
        )
        live = (seq_idx.to(x.device) >= 0).to(y.dtype)
        y = (y.reshape(batch, seqlen, dim) * live[:, :, None]).transpose(1, 2)
        if not return_final_state:
            return y
        last = {run.row: i for i, run in enumerate(runs)}  # the row's last sequence
        return y, final[[last[b] for b in range(batch)]][:, :, 1:]

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
        loaded = self._loaded()
        batch, _, tokens, width, state_len = check_update_args(
            x, conv_state, weight, bias, activation, cache_seqlens, state_indices
        )
        if state_len != width:
            raise ContractError(
                f"fla's decode state is (N, D, W): state_len {state_len} != K = {width}"
            )
        if cache_seqlens is not None:
            raise ContractError("fla's decode update has no ring-buffer state (cache_seqlens)")
        rows = conv_state
        if state_indices is not None:
            identity = torch.arange(batch, device=state_indices.device)
            if not torch.equal(state_indices.long(), identity):
                raise ContractError("fla's decode update has no state_indices (slot mapping)")
            rows = conv_state[:batch]
        cache = rows if rows.is_contiguous() else rows.contiguous()  # fla would copy it anyway
        with torch.no_grad():
            if tokens == 1:
                y, _ = loaded.update.causal_conv1d_update(
                    x[:, :, 0], cache, weight=weight, bias=bias, activation=activation
                )
                y = y[:, :, None]
            else:  # what fla's ShortConvolution does with several tokens
                y, final = self._conv(x.transpose(1, 2), weight, bias, cache, True, activation)
                cache.copy_(final)
                y = y.transpose(1, 2)
            if cache is not rows:
                rows.copy_(cache)
        return y
