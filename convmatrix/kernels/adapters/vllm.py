"""Adapter ``vllm``: vLLM's Triton causal conv1d (``vllm.model_executor.layers.mamba.ops.
causal_conv1d``) behind the canonical protocol, loaded lazily: imported from vllm on a CUDA
machine; elsewhere the file alone, from a vLLM source tree, under the Triton interpreter
(``convmatrix.kernels.adapters.vllm_source``; docs/peers.md).

Read in vllm-project/vllm, ``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` at commit
533d3378ca79f40c74f52190935b8d95bbf34fcd (and 03c6dad84ad3b1df303e98805a3a0324d70e1539, which
differs only where noted), with its tests ``tests/kernels/mamba/test_causal_conv1d.py``:

- ``causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
  has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID, ...)``: varlen forward,
  x ``(dim, total_tokens)``, sequences delimited by ``query_start_loc``; sequence i starts from
  the first K-1 columns of ``conv_states[cache_indices[i]]`` when ``has_initial_state[i]`` (else
  zeros) and writes its own final state there (``conv_states`` stride(1) == 1, asserted);
  computes in the state dtype (``x.to(conv_states.dtype)``), y in a new tensor; no autograd.
  The kernel applies the taps of widths 2, 3 and 4 only (width 5 loads a fourth state column
  but has no branch for its taps). Each Triton program also compares its *sequence number*
  with ``pad_slot_id`` (``if idx_seq == pad_slot_id: return``), so the forward is always called
  with ``pad_slot_id=-1`` (``convmatrix.kernels.adapters.vllm_style`` does the translation, shared
  with torch_mlu_ops' port of this op).
- ``causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
  conv_state_indices=None, num_accepted_tokens=None, query_start_loc=None, max_query_len=-1,
  pad_slot_id=PAD_SLOT_ID, ...)``: x ``(B, dim, T)`` any strides, several tokens per call;
  ``conv_state`` ``(lines, dim, S >= K-1)``, but the kernel's ``state_len`` is ``width - 1``: it
  reads the first K-1 columns as the history and shifts only those (Dao shifts the whole S);
  ``conv_state_indices`` is loaded unconditionally (always passed here, ``arange(B)`` without
  slots); a row whose index equals ``pad_slot_id`` is skipped and its y left unwritten (zeroed
  here); no ``cache_seqlens``; tap branches for widths 2 to 6. At 533d337 y is written into x
  (``out = x``; x is already in the state dtype here), at 03c6dad into a new tensor.
- ``PAD_SLOT_ID = -1``; vLLM V1 marks unused state rows with ``NULL_BLOCK_ID = 0``
  (``vllm/v1/attention/backends/utils.py``). This adapter passes its declared pad id to the
  update explicitly: 0 by default (``vllm``), -1 for
  ``convmatrix.kernels.adapters.vllm:pad_minus_one``; an update without slots gets ``arange(B)``
  and pad -1 (no row is padding; pad 0 would skip row 0).

vLLM 0.33.0 (its wheel's file, read and run here) renamed the update's ``pad_slot_id`` to
``null_block_id`` and gave the forward a ``null_block_id`` too; the adapter reads the
signatures it finds (``_ops_of``).

Declared (``Capabilities``): forward widths 2-4, update widths 2-6, no backward, no ring buffer,
a decode state of exactly K-1 columns, a final state per packed sequence, y into x for the
update, the pad slot id, products in the input dtype. Everything else (layouts, gaps, dtypes)
is left to the matrix to test.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from convmatrix.kernels.adapters import triton_interpreter, triton_probes, vllm_source
from convmatrix.kernels.adapters.vllm_style import vllm_style_forward
from convmatrix.kernels.interface.protocol import (
    FEATURES,
    STATE_LEN_K_MINUS_1,
    Capabilities,
    ContractError,
    Geometry,
    KernelBase,
)
from convmatrix.kernels.interface.semantics import check_update_args

__all__ = ["NULL_BLOCK_ID", "VllmKernel", "VllmOps", "load_vllm_ops", "pad_minus_one"]

MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
NULL_BLOCK_ID = 0  # vLLM V1's id of the state row no request owns
# The forward's Triton programs take BLOCK_M = 8 tokens and BLOCK_N = 256 channels; a program
# whose chunk is not a sequence's first reads its halo from x, the first from conv_states.
GEOMETRY = Geometry(time_tile=8, channel_tile=256)


@dataclass(frozen=True)
class VllmOps:
    """The two entry points, from vLLM or from ``convmatrix.kernels.doubles.vllm_standin``."""

    causal_conv1d_fn: Callable[..., Any]
    causal_conv1d_update: Callable[..., Any]
    label: str = "vllm"
    # the update's keyword for the id of a row it skips: pad_slot_id until vLLM renamed it
    # null_block_id (0.33 has only the latter)
    pad_keyword: str = "pad_slot_id"
    facts: Mapping[str, Any] = field(default_factory=dict)  # how it was loaded (describe)


def _ops_of(module: Any, label: str, facts: Mapping[str, Any]) -> VllmOps:
    """The entry points of vLLM's module, adapted to the signatures this version has: a
    forward with ``null_block_id`` (0.33) skips the sequences whose line is that id, and the
    adapter gives every sequence its own line from 0, so it passes -1 (no line is the null
    block; the check stays compiled in, as vLLM runs it)."""
    fn, update = module.causal_conv1d_fn, module.causal_conv1d_update
    if "null_block_id" in inspect.signature(fn).parameters:
        fn = functools.partial(fn, null_block_id=-1)
    params = inspect.signature(update).parameters
    keyword = "null_block_id" if "null_block_id" in params else "pad_slot_id"
    return VllmOps(fn, update, label, keyword, facts)


def _interpreted_source() -> tuple[VllmOps | None, str | None]:
    """vLLM's Triton file from a source tree, under the Triton interpreter (no GPU here)."""
    root = vllm_source.find_source()
    if isinstance(root, str):
        return None, root
    reason = triton_interpreter.enable()
    if reason:
        return None, reason
    try:  # before the file's kernels are decorated (some defects act then)
        workarounds = triton_interpreter.apply_workarounds()
        module = vllm_source.load_source(root)
    except Exception as exc:  # a Triton this file does not run on, an import not bridged
        return (
            None,
            f"vLLM's {vllm_source.FILE} in {root} not loadable: {type(exc).__name__}: {exc}",
        )
    if not triton_interpreter.is_interpreted(module._causal_conv1d_update_kernel):
        return None, "Triton was imported before TRITON_INTERPRET=1 and there is no GPU"
    loops = vllm_source.runtime_range_loops(root / vllm_source.FILE)
    if loops and triton_probes.range_tensor():
        return None, (
            f"this Triton's interpreter cannot loop over range(n) with n a runtime value, which "
            f"{vllm_source.FILE} does (lines {', '.join(map(str, loops))}): every forward would "
            "raise; run it under a Triton whose interpreter can (docs/peers.md)"
        )
    facts = {
        "vllm_source": str(root / vllm_source.FILE),
        "interpreter": True,
        "interpreter_workarounds": workarounds,
    }
    return _ops_of(module, "vllm", facts), None


def load_vllm_ops() -> tuple[VllmOps | None, str | None]:
    """(vLLM's ops, None) or (None, why not); never raises. With CUDA, vLLM is imported as
    it is; without, its Triton file runs under the interpreter (``vllm_source``)."""
    if not torch.cuda.is_available():
        return _interpreted_source()
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # not installed, or built for another torch
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    return _ops_of(module, "vllm", {"interpreter": False}), None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class VllmKernel(KernelBase):
    """``VllmKernel()`` uses vLLM (loaded on first use); ``VllmKernel(ops)`` any implementation
    of its API; ``pad_slot_id`` is the id this kernel's update skips (see the module docstring)."""

    def __init__(self, ops: VllmOps | None = None, pad_slot_id: int = NULL_BLOCK_ID) -> None:
        self._ops, self._reason, self._loaded = ops, None, ops is not None
        label = "" if ops is None else ops.label
        pad = "" if pad_slot_id == NULL_BLOCK_ID else f"pad{pad_slot_id}"
        suffix = ",".join(p for p in (label, pad) if p)
        self.name = f"vllm[{suffix}]" if suffix else "vllm"
        self.source_module = "vllm" if ops is None else ops.causal_conv1d_update.__module__
        self.capabilities = Capabilities(
            widths=frozenset({2, 3, 4}),
            update_widths=frozenset({2, 3, 4, 5, 6}),
            features=FEATURES - {"backward", "ring_buffer"},
            geometry=GEOMETRY,
            error_types=(AssertionError,),
            state_lens=STATE_LEN_K_MINUS_1,
            final_state="per_sequence",
            inplace_y=frozenset({"update"}),
            pad_slot_id=pad_slot_id,
            # Triton's promotion computes x * w in 16 bits when either is fp16, or both bf16
            # (fp16 wins over bf16), before the fp32 accumulator: products are rounded to the
            # input dtype (measured under the interpreter on nightly: 13 such 16-bit cases
            # over the fp32-intermediate bound, none under this one)
            intermediate="input",
        )

    def _require(self) -> VllmOps:
        if not self._loaded:
            self._ops, self._reason = load_vllm_ops()
            self._loaded = True
        if self._ops is None:
            raise ContractError(f"{self.name} unavailable: {self._reason}")
        return self._ops

    def availability(self) -> str | None:
        try:
            self._require()
        except ContractError:
            return self._reason
        return None

    def describe(self) -> Mapping[str, Any]:
        versions = {"vllm": _version("vllm"), "triton": _version("triton")}
        facts = dict(self._ops.facts) if self._ops is not None else {}
        if self._ops is not None:
            facts["pad_keyword"] = self._ops.pad_keyword
        return {
            **super().describe(),
            **versions,
            **facts,
            "pad_slot_id": self.capabilities.pad_slot_id,
            "unavailable": self._reason,
        }

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
        return vllm_style_forward(self._require().causal_conv1d_fn, *args, return_final_state)

    def _indices(self, state_indices: torch.Tensor | None, batch: int, device: Any) -> Any:
        """(conv_state_indices as vLLM takes them, the pad id for this call). Without slots
        every row is live: ``arange(B)`` with pad -1 (with pad 0 vLLM would skip row 0)."""
        if state_indices is None:
            return torch.arange(batch, dtype=torch.int32, device=device), -1
        pad = self.capabilities.pad_slot_id
        if bool(((state_indices < 0) & (state_indices != pad)).any()):
            raise ContractError(f"negative slot ids are outside the pool; padding is {pad} here")
        return state_indices.to(device=device, dtype=torch.int32), pad

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
        batch, _, _, width, state_len = check_update_args(
            x, conv_state, weight, bias, activation, cache_seqlens, state_indices
        )
        caps = self.capabilities
        if cache_seqlens is not None:
            raise ContractError("vLLM's causal_conv1d_update has no cache_seqlens (ring buffer)")
        if caps.update_widths is not None and width not in caps.update_widths:
            raise ContractError(f"update width {width} not in {sorted(caps.update_widths)}")
        if not caps.state_lens.accepts(width, state_len):
            raise ContractError(
                f"vLLM shifts only the first K-1 state columns: needs S == K-1, got S={state_len}"
            )
        indices, pad = self._indices(state_indices, batch, x.device)
        with torch.no_grad():
            y = ops.causal_conv1d_update(
                x, conv_state, weight, bias, activation, conv_state_indices=indices,
                **{ops.pad_keyword: pad},
            )  # fmt: skip
        live = (indices != pad)[:, None, None]
        return torch.where(live, y, torch.zeros((), dtype=y.dtype, device=y.device))


def pad_minus_one() -> VllmKernel:
    """vLLM with ``pad_slot_id = -1`` (its ``PAD_SLOT_ID``, as its kernel tests call it)."""
    return VllmKernel(pad_slot_id=-1)
