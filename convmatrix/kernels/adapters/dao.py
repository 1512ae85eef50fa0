"""Adapter ``dao``: Dao-AILab's causal-conv1d CUDA kernels behind the canonical protocol.

Calls ``causal_conv1d.causal_conv1d_fn(x, weight, bias, seq_idx, initial_states,
return_final_states, final_states_out, activation)`` and ``causal_conv1d_update(x, conv_state,
weight, bias, activation, cache_seqlens, conv_state_indices)`` (causal_conv1d_interface.py),
imported lazily: on a machine without the package or a GPU ``availability()`` says why.

The contract is declared so that the matrix files violations as expected-error cases instead
of numeric failures. From csrc/causal_conv1d.cpp (TORCH_CHECK → RuntimeError) and the Python
interface (assert → AssertionError):

- widths 2-4;
- channel-last (``x.stride(1) == 1``) needs ``dim % 8 == 0`` and ``x.stride(0)``,
  ``x.stride(2)`` multiples of 8;
- ``seq_idx``, initial and final states only in channel-last; states are laid out
  ``(B, K-1, C).transpose(1, 2)`` (``initial_states.stride(1) == 1``): the adapter lays a
  canonical state out that way, keeping autograd through the copy;
- ``seq_idx`` with initial states from 1.7.0 (PR #118; the interface asserted before);
  ``seq_idx`` with returned final states: asserted by every interface version read;
- negative ``seq_idx`` / ``conv_state_indices`` mark padding from 1.5.3 (PR #78, forward and
  update kernels only, so backward through padding tokens is declared from 1.7.0, whose tests
  check gradients with padding); padding rows of an update are left unwritten by the kernel,
  the adapter zeroes them (canonical: padding outputs 0);
- updates with several tokens, ``state_len > K`` and ``cache_seqlens`` / ``conv_state_indices``
  need the current ``causal_conv1d_update`` signature; the first releases took one token
  ``(B, C)`` and a ``(B, C, K)`` state (detected from the signature).

Geometry: the channel-last forward works on 64-token x 32/64-channel chunks (16-byte vectors
of 4 fp32 / 8 half), the channel-first forward on chunks of 128 threads x 4/8 elements = 512
(fp32) / 1024 (16-bit) tokens per channel. ``dao`` declares the channel-last 16-bit one,
``convmatrix.kernels.adapters.dao:channel_first`` the channel-first 16-bit one, and
``DaoKernel((layout, bytes))`` any of ``GEOMETRIES`` in Python, so that ``tile+1``
etc. hit the boundaries of the kernel the matrix is aimed at.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import STATE_LEN_K
from convmatrix.core.layout import storage_layout
from convmatrix.kernels.interface.protocol import Capabilities, ContractError, Geometry, KernelBase

__all__ = [
    "GEOMETRIES",
    "DaoKernel",
    "channel_first",
    "dao_capabilities",
    "dao_contract",
]

# (layout, bytes per x element) → the chunk a thread block owns.
GEOMETRIES = {
    ("channel_last", 2): Geometry(time_tile=64, channel_tile=64, vector_width=8),
    ("channel_last", 4): Geometry(time_tile=64, channel_tile=32, vector_width=4),
    ("channel_first", 2): Geometry(time_tile=1024, channel_tile=1, vector_width=8),
    ("channel_first", 4): Geometry(time_tile=512, channel_tile=1, vector_width=4),
}
LATEST = (1, 7, 0)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _x_strides(case: Case) -> tuple[int, ...]:
    """The strides the runner gives x for this case (its layout/gap rules)."""
    length = case.seqlen if case.op != "update" else case.tokens
    return storage_layout((case.batch, case.dim, length or 1), case.layout, case.gap)[0]


def _channel_last_reason(dim: int, strides: tuple[int, ...] | None) -> str | None:
    if dim % 8:
        return f"channel-last needs dim % 8 == 0, got dim {dim}"
    if strides is not None and (strides[0] % 8 or strides[2] % 8):
        return f"channel-last needs x.stride(0) and x.stride(2) multiples of 8, got {strides}"
    return None


def dao_capabilities(geometry: Geometry | None = None, legacy: bool = False) -> Capabilities:
    """The part of causal-conv1d's contract that is plain data: widths 2-4, final states only
    without ``seq_idx``, its exception types; with the first, one-token
    ``causal_conv1d_update`` (``legacy``) also one token per call and a (B, C, K) state."""
    caps = Capabilities(
        widths=frozenset({2, 3, 4}),
        final_state="unpacked",
        geometry=geometry or GEOMETRIES[("channel_last", 2)],
        error_types=(RuntimeError, AssertionError, NotImplementedError),
    )
    return replace(caps, max_update_tokens=1, state_lens=STATE_LEN_K) if legacy else caps


def dao_contract(case: Case, version: tuple[int, ...] = LATEST, legacy: bool = False) -> str | None:
    """Why causal-conv1d ``version`` rejects ``case`` (see the module docstring), or None:
    the declared part (``dao_capabilities``), then the rules of layouts, strides and versions.

    ``legacy``: the installed ``causal_conv1d_update`` has the first, one-token signature.
    """
    declared = dao_capabilities(legacy=legacy).contract_violation(case)
    if declared:
        return declared
    packed = case.seq_lens is not None
    padding = packed and any(n < 0 for n in case.seq_lens)
    if case.op == "update":
        if legacy and (case.circular or (case.slots and case.slots != "identity")):
            return "this causal_conv1d_update has no cache_seqlens / conv_state_indices"
        if case.slots == "permuted_pad" and version < (1, 5, 3):
            return "pad slots (negative conv_state_indices) need causal-conv1d >= 1.5.3"
        return None
    has_state = case.initial_state not in (None, "none")
    if case.layout == "channel_last":
        reason = _channel_last_reason(case.dim, _x_strides(case))
        if reason:
            return reason
    elif packed or has_state or case.final_state:
        return "seq_idx, initial_states and final_states need the channel-last layout"
    if packed and has_state and version < (1, 7, 0):
        return "seq_idx with initial_states needs causal-conv1d >= 1.7.0"
    if padding and version < (1, 5, 3):
        return "padding tokens (negative seq_idx) need causal-conv1d >= 1.5.3"
    if padding and case.op == "fwd_bwd" and version < (1, 7, 0):
        return "backward through padding tokens is checked upstream from 1.7.0"
    return None


def _state_layout(state: torch.Tensor | None) -> torch.Tensor | None:
    """A canonical (B, C, K-1) state laid out as Dao wants it: (B, K-1, C).transpose(1, 2)."""
    if state is None or state.stride(1) == 1:
        return state
    return state.transpose(1, 2).contiguous().transpose(1, 2)


class DaoKernel(KernelBase):
    """The installed causal-conv1d; ``version`` overrides the detected one (tests, planning)."""

    def __init__(
        self, geometry_key: tuple[str, int] = ("channel_last", 2), version: str | None = None
    ) -> None:
        layout, size = geometry_key
        self.name = "dao" if geometry_key == ("channel_last", 2) else f"dao[{layout},{8 * size}bit]"
        self._geometry = GEOMETRIES[geometry_key]
        self.source_module = "causal_conv1d"
        self._forced_version = None if version is None else _version(str(version))
        self._module: Any = None
        self._import_error: str | None = None

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> Any:
        if self._module is None and self._import_error is None:
            try:
                self._module = importlib.import_module("causal_conv1d")
            except Exception as exc:  # missing, or built against another torch/CUDA
                self._import_error = f"{type(exc).__name__}: {exc}"
        return self._module

    def availability(self) -> str | None:
        if self._load() is None:
            return f"causal_conv1d not importable: {self._import_error}"
        if not torch.cuda.is_available():
            return "needs a CUDA device (torch.cuda.is_available() is False)"
        return None

    def version(self) -> tuple[int, ...]:
        if self._forced_version is not None:
            return self._forced_version
        module = self._load()
        if module is None:  # not installed: judge cases by the newest contract
            return LATEST
        return _version(getattr(module, "__version__", "")) or LATEST

    def _legacy_update(self) -> bool:
        module = self._load()
        if module is None:
            return False
        return "cache_seqlens" not in inspect.signature(module.causal_conv1d_update).parameters

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """Declared from the installed update's signature (imports causal_conv1d lazily)."""
        return dao_capabilities(self._geometry, self._legacy_update())

    def contract_violation(self, case: Case) -> str | None:
        return dao_contract(case, self.version(), self._legacy_update())

    def describe(self) -> Mapping[str, Any]:
        module = self._load()
        version = getattr(module, "__version__", None) if module is not None else None
        return {**super().describe(), "causal_conv1d": version, "import_error": self._import_error}

    # -- calls -------------------------------------------------------------------------------
    def _require(self) -> Any:
        reason = self.availability()
        if reason:
            raise ContractError(f"dao unavailable: {reason}")
        return self._module

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
        dao = self._require()
        if seq_idx is not None:
            seq_idx = seq_idx.to(torch.int32).contiguous()
        out = dao.causal_conv1d_fn(
            x,
            weight,
            bias,
            seq_idx=seq_idx,
            initial_states=_state_layout(initial_state),
            return_final_states=return_final_state,
            activation=activation,
        )
        return tuple(out) if return_final_state else out

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
        dao = self._require()
        if self._legacy_update():
            if cache_seqlens is not None or state_indices is not None or x.shape[2] != 1:
                raise ContractError("this causal_conv1d_update takes one token, no ring/slots")
            return dao.causal_conv1d_update(x[:, :, 0], conv_state, weight, bias, activation)[
                :, :, None
            ]
        ints = [None if t is None else t.to(torch.int32) for t in (cache_seqlens, state_indices)]
        y = dao.causal_conv1d_update(x, conv_state, weight, bias, activation, *ints)
        if state_indices is not None:  # the kernel skips pad rows without writing them
            y[state_indices.to(y.device) < 0] = 0
        return y


def channel_first() -> DaoKernel:
    """Dao aimed at its channel-first kernel (16-bit: 1024-token chunks per channel)."""
    return DaoKernel(("channel_first", 2))
