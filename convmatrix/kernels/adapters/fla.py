"""Adapter ``fla``: flash-linear-attention's Triton causal conv1d (PyPI ``fla-core``) as a
canonical kernel, natively on CUDA and on a CPU under the Triton interpreter.

fla's API (``fla.modules.causal_conv1d``, read in fla-core 0.6.0's ``ops.py``):

- ``causal_conv1d(x, weight, bias, residual, initial_state, output_final_state, activation,
  backend="triton", cu_seqlens=None, ...) -> (y, final_state)``: ``x`` ``(B, T, D)`` any
  strides (``(1, total, D)`` with ``cu_seqlens`` ``(N+1,)``), ``weight`` ``(D, W)``;
  autograd (``CausalConv1dFunction``) gives dx, dweight, dbias and d initial_state.
  ``initial_state`` / ``final_state`` are ``(N, D, W)``: **W** columns, the last W inputs of
  each sequence (column W-1 the newest). The forward kernel reads columns 1..W-1 only
  (column 0 is one token too old to reach any output); the backward ignores the gradient of
  final-state column 0. Time tile ``BT = chunk_size = 64``; channel tile ``BD`` autotuned
  from 16/32/64/128.
- ``causal_conv1d_update(x, cache, residual, weight, bias, activation) -> (y, cache)``: one
  token per sequence, ``x`` ``(N, D)``, ``cache`` ``(N, D, W)`` (made contiguous by fla's
  ``input_guard``), shifted left by one and the token written to column W-1, in place; ``y``
  from the shifted cache. fla's own layer (``ShortConvolution``) takes this path for one token
  and otherwise calls ``causal_conv1d`` with the cache as initial state and
  ``output_final_state=True``.

Translation of a canonical call (docs/spec.md §2):

- x ``(B, C, L)`` → ``x.transpose(1, 2)`` (a view, any strides); y comes back contiguous
  ``(B, L, C)`` and is viewed as ``(B, C, L)``;
- the canonical state ``(B, C, K-1)`` → ``(B, C, K)`` with a zero column 0; the canonical
  final state is columns 1..K-1 of fla's (gradients flow through both slices);
- packed rows (``seq_idx``) → ``(1, B*L, C)`` tokens, one fla sequence per run of equal ids
  (padding runs included), ``cu_seqlens`` at the run boundaries; the initial state goes to the
  first run of its row, the others start from zero (fla: no state = zero state); outputs of
  padding tokens (negative ids) are zeroed here, which also zeroes their gradients; the final
  state is that of the row's last run;
- decode with one token → fla's in-place update on the state itself; with several tokens →
  ``causal_conv1d`` with the state as initial state, its final state copied into the state
  (what ``ShortConvolution`` does); ``state_indices`` naming rows 0..B-1 in order → those
  rows of the pool, updated in place.

What fla cannot express, declared in its ``Capabilities`` (docs/contract.md) so the matrix
files such cases as expected errors (and the calls raise ``ContractError``):

- a decode state of any length but W (``state_lens=STATE_LEN_K``: fla's cache is
  ``(N, D, W)``);
- a final state with packing when a row's last sequence is shorter than K-1 (and is not the
  whole row) (``final_state="per_sequence"``): fla's final state is per sequence and starts
  that sequence from zeros, while the canonical one is the row's last K-1 inputs across the
  boundary.

Missing features (cases skipped): ring-buffer states (``cache_seqlens``) and slot mapping
(``state_indices`` other than the identity).

On a machine without CUDA the adapter turns the Triton interpreter on before importing fla
(``convmatrix.kernels.adapters.triton_interpreter``), keeps one autotune config per kernel (BD = 16,
declared as the channel tile) and installs the interpreter workarounds that its Triton
version needs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from convmatrix.kernels.adapters import triton_interpreter
from convmatrix.kernels.adapters.mlu_ops import boundaries, check_final_state, runs_of, token_major
from convmatrix.kernels.interface.protocol import (
    FEATURES,
    STATE_LEN_K,
    Capabilities,
    ContractError,
    Geometry,
    KernelBase,
)
from convmatrix.kernels.oracle.semantics import check_forward_args, check_update_args

__all__ = ["FlaKernel"]

TIME_TILE = 64  # fla's chunk_size (BT), a Python default of causal_conv1d_fwd/bwd
INTERPRETER_BD = 16  # the one channel-tile config kept under the interpreter


@dataclass
class _Loaded:
    conv: Any = None  # fla.modules.causal_conv1d
    reason: str | None = None
    interpreted: bool = False
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    workarounds: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _load() -> _Loaded:
    """Import fla once per process; never raises (the reason lands in ``availability``)."""
    loaded = _Loaded(versions={"fla-core": _version("fla-core"), "triton": _version("triton")})
    if importlib.util.find_spec("fla") is None:  # looked up without importing anything
        loaded.reason = "fla-core is not installed (pip install 'convmatrix[fla]')"
        return loaded
    if not torch.cuda.is_available():
        # No CUDA device: compiled Triton cannot run here, only its interpreter can. The flag
        # is read when a kernel is decorated (when fla's modules are imported), so it has to
        # be set now, before the first import of triton/fla, and only here, so that importing
        # convmatrix changes nothing for anyone who does not run this kernel on a CPU.
        loaded.reason = triton_interpreter.enable()
        if loaded.reason:
            return loaded
    loaded.interpreted = triton_interpreter.interpreting()
    try:
        with warnings.catch_warnings():
            # fla warns "Triton is not supported on current platform" on a CPU: expected here.
            warnings.filterwarnings("ignore", message="Triton is not supported")
            triton = importlib.import_module("triton")
            conv = importlib.import_module("fla.modules.causal_conv1d")
            ops = importlib.import_module("fla.modules.causal_conv1d.ops")
    except Exception as exc:  # missing triton, or an fla built for something else
        loaded.reason = f"fla not importable: {type(exc).__name__}: {exc}"
        return loaded
    if loaded.interpreted:
        if not triton_interpreter.is_interpreted(ops.causal_conv1d_fwd_kernel):
            loaded.reason = (
                "fla was imported before TRITON_INTERPRET=1 was set, so its kernels are "
                "compiled-only and there is no GPU; import convmatrix's fla adapter first"
            )
            return loaded
        version = triton_interpreter.version_tuple(triton.__version__)
        loaded.workarounds = triton_interpreter.apply_workarounds(version)
        loaded.configs = triton_interpreter.force_single_config(
            triton_interpreter.autotuners(ops), BD=INTERPRETER_BD
        )
    loaded.conv = conv
    return loaded


def _wide(state: torch.Tensor) -> torch.Tensor:
    """(N, C, K-1) → fla's (N, C, K): a zero column 0 (never read), contiguous."""
    return torch.cat([state.new_zeros(state.shape[0], state.shape[1], 1), state], dim=2)


class FlaKernel(KernelBase):
    """fla-core's Triton causal conv1d (lazy import; see the module docstring)."""

    name = "fla"

    def __init__(self) -> None:
        interpreted = not torch.cuda.is_available() or triton_interpreter.interpreting()
        self.source_module = "fla"
        self.capabilities = Capabilities(
            features=FEATURES - {"ring_buffer", "slot_indices"},
            geometry=Geometry(
                time_tile=TIME_TILE, channel_tile=INTERPRETER_BD if interpreted else None
            ),
            state_lens=STATE_LEN_K,  # fla's decode cache is (N, D, W)
            final_state="per_sequence",  # fla's final state is its last sequence's
            intermediate="input",  # Triton computes in the input dtype (bound model)
        )

    # -- loading -----------------------------------------------------------------------------
    def availability(self) -> str | None:
        return _load().reason

    def _conv(self) -> Any:
        loaded = _load()
        if loaded.reason:
            raise ContractError(f"fla unavailable: {loaded.reason}")
        return loaded.conv

    def describe(self) -> Mapping[str, Any]:
        loaded = _load()
        return {
            **super().describe(),
            **loaded.versions,
            "interpreter": loaded.interpreted,
            "autotune_configs": loaded.configs,
            "interpreter_workarounds": loaded.workarounds,
            "unavailable": loaded.reason,
        }

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
        conv = self._conv()
        batch, dim, seqlen, width = check_forward_args(
            x, weight, bias, initial_state, seq_idx, activation
        )
        if seq_idx is None:
            y, final = conv.causal_conv1d(
                x.transpose(1, 2),
                weight,
                bias,
                initial_state=None if initial_state is None else _wide(initial_state),
                output_final_state=return_final_state,
                activation=activation,
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
        y, final = conv.causal_conv1d(
            token_major(x)[None],
            weight,
            bias,
            initial_state=init,
            output_final_state=return_final_state,
            activation=activation,
            cu_seqlens=boundaries(runs, seqlen, x.device),
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
        conv = self._conv()
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
                y, _ = conv.causal_conv1d_update(
                    x[:, :, 0], cache, weight=weight, bias=bias, activation=activation
                )
                y = y[:, :, None]
            else:
                y, final = conv.causal_conv1d(
                    x.transpose(1, 2),
                    weight,
                    bias,
                    initial_state=cache,
                    output_final_state=True,
                    activation=activation,
                )
                cache.copy_(final)
                y = y.transpose(1, 2)
            if cache is not rows:
                rows.copy_(cache)
        return y
