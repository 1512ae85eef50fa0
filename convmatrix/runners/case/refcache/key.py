"""The key of an entry: everything that decides what it stores, spelled out in full.

An entry stores r and the bound of each output (``footprint``), so its key is everything
either follows: the reference's version (``REFERENCE_VERSION``), the device type it is
computed on, the channel blocks, the case's identity (its canonical parameters and id, which
seeds its tensors: op, dtypes, layout, activation, packing, ...), the bytes, dtype, shape and
strides of every tensor the reference reads (x, weight, bias, initial state, seq_idx, and the
upstream gradients dy and dF, with dy's layout as the kernel gets it), and the bound's
parameters (each output's declared arithmetic, the bound model).

``Key.text`` is that description (tensors by their SHA-256); ``Key.hex`` its SHA-256. An
entry holds its ``text`` and is used only when it matches in full, so two entries swapped,
or one copied over another, are misses, never another case's reference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.tolerances import Policy
from convmatrix.runners.case.bounds import arithmetic
from convmatrix.runners.case.refcache.footprint import output_sizes

__all__ = ["REFERENCE_VERSION", "BoundSpec", "Key", "cache_key"]

# Move this whenever the float64 oracle, the bound model, the channel blocking or the stored
# form (``footprint``, ``compact``) change what an entry would hold: every entry then misses.
# 2: r and the bound rounded up to float32 instead of r and magnitudes (version 1); 3: the
# slack magnitudes of chunked calls; 4: r split where judged in float32, the bound widened by
# what the stored r moved and rounded up to bfloat16 (old entries miss, not "damaged").
REFERENCE_VERSION = 4


@dataclass(frozen=True)
class BoundSpec:
    """What the bound of an output follows besides the reference: the kernel's declared
    arithmetic and the verdict policy's bound model."""

    contract: Capabilities
    policy: Policy

    def describe(self, case: Case) -> dict[str, Any]:
        outputs = output_sizes(case) or {"y": 0, "state": 0}
        return {
            "model": asdict(self.policy.model),
            "arithmetic": {o: asdict(arithmetic(self.contract, case, o)) for o in outputs},
        }


@dataclass(frozen=True)
class Key:
    """An entry's key: ``hex`` names its file, ``text`` is the whole key it must hold."""

    hex: str
    text: str


def tensor_digest(t: torch.Tensor | None) -> dict[str, Any] | None:
    """dtype, shape, strides and SHA-256 of the bytes of ``t`` (a view's own strides: its
    layout; the bytes of its values in logical order)."""
    if t is None:
        return None
    values = t.detach().cpu().contiguous()
    raw = values.view(torch.uint8) if values.numel() else values
    digest = hashlib.sha256(raw.numpy() if values.numel() else b"").hexdigest()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "strides": list(t.stride()),
        "sha256": digest,
    }


def _inputs(inputs: Any) -> dict[str, Any]:
    """Every tensor the reference reads, and the views the kernel is handed (layouts)."""

    def values(g: Any) -> torch.Tensor | None:
        return None if g is None else g.values

    def view(g: Any) -> torch.Tensor | None:
        return None if g is None else g.view

    tensors = {
        "x": values(inputs.x),
        "x.view": view(inputs.x),
        "weight": values(inputs.weight),
        "bias": values(inputs.bias),
        "initial_state": values(inputs.initial_state),
        "initial_state.view": view(inputs.initial_state),
        "seq_idx": inputs.seq_idx,
        "dy": inputs.g,
        "dy.view": inputs.g_view,
        "dfinal": inputs.q,
    }
    out = {}
    for name, t in tensors.items():
        if name.endswith(".view"):  # the layout only: its values are the ones above
            out[name] = None if t is None else {"strides": list(t.stride())}
        else:
            out[name] = tensor_digest(t)
    return out


def cache_key(
    case: Case, inputs: Any, spans: list[Any], bounds: BoundSpec, device: str = "cpu"
) -> Key:
    """The key of ``case``'s entry for forward ``inputs`` in the channel blocks ``spans``
    ((start, stop) or None), bounds per ``bounds``, the reference computed on ``device``
    (a type: cpu, cuda)."""
    described = {
        "version": REFERENCE_VERSION,
        "device": device,
        "spans": [None if s is None else list(s) for s in spans],
        "case": {**case.canonical(), "id": case.id},
        "inputs": _inputs(inputs),
        "bounds": bounds.describe(case),
    }
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
    return Key(hashlib.sha256(text.encode()).hexdigest()[:40], text)
