"""One case of the matrix: a frozen value with a stable id.

Everything downstream (runners, database, reports) works from ``Case`` values, never from raw
YAML. The id is a short hash of the canonical parameters, so the same case has the same id on
every machine and in every run: ``convmatrix diff`` matches two kernel commits by it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Literal

from convmatrix.core.dtypes import short_name

__all__ = ["CHECKS", "GAPS", "GRAD_LAYOUTS", "OPS", "Case"]

OPS = ("fwd", "fwd_bwd", "update")
# Gapped (legal strided) views of a larger buffer:
#   channel_slice - the channels are a slice of a wider buffer (Mamba2's in_proj split);
#   row_pad       - the innermost rows of the storage are padded (stride > extent);
#   batch_pad     - the batch stride is padded.
GAPS = ("channel_slice", "row_pad", "batch_pad")
# Layouts of the upstream gradient dy (fwd_bwd): a channel slice of a wider token-major
# gradient (the split of a fused projection's gradient, fla PR #871) or the stride-0 dy of
# ``y.sum().backward()``.
GRAD_LAYOUTS = ("gapped", "expanded")
# Property checks a case may ask for besides the numeric comparison (docs/spec.md §3).
CHECKS = ("causality", "packed_isolation", "chunk_consistency")

# Fields that are not part of a case's identity.
_NOT_IDENTITY = frozenset({"id", "checks", "timed", "expect_reason"})
# Fields added after ids were published: part of the identity only when set, so every case
# that does not use them keeps the id it always had.
_LATE = ("grad_layout",)


@dataclass(frozen=True)
class Case:
    """Canonical parameters of one check. ``None`` where a field does not apply to ``op``.

    Shapes follow Dao: x (batch, dim, seqlen), weight (dim, width). For ``update``: ``steps``
    calls of ``tokens`` new tokens each against a state of length ``state_len`` (>= width-1),
    ``circular`` selects the ring buffer (cache_seqlens), ``slots`` the continuous-batching
    mapping: None, "identity", "permuted" or "permuted_pad" (a pad slot id -1 on some rows).
    ``seq_lens`` packs the sequence: segment lengths summing to seqlen, a negative entry -n
    being n padding tokens (seq_idx -1). ``expect`` is "ok" or "error" (contract violation).
    """

    suite: str
    op: Literal["fwd", "fwd_bwd", "update"]
    width: int
    dim: int
    batch: int
    x_dtype: str = "float32"
    w_dtype: str = "float32"
    layout: str = "channel_first"
    gap: str | None = None
    activation: str | None = None
    bias: bool = True
    seqlen: int | None = None
    initial_state: str | None = None  # "none" | "zeros" | "random"
    final_state: bool | None = None
    dfinal: str | None = None  # "zero" | "random" (upstream gradient of the final state)
    seq_lens: tuple[int, ...] | None = None
    tokens: int | None = None
    steps: int | None = None
    state_len: int | None = None
    circular: bool | None = None
    slots: str | None = None
    grad_layout: str | None = None  # None: dense dy; "gapped" | "expanded" (GRAD_LAYOUTS)
    expect: str = "ok"
    expect_reason: str | None = None
    checks: tuple[str, ...] = ()
    timed: bool = False
    id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", self.stable_id())

    # -- identity ---------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """The identity-bearing parameters as plain JSON data, keys sorted."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_IDENTITY}
        if data["seq_lens"] is not None:
            data["seq_lens"] = list(data["seq_lens"])
        for late in _LATE:
            if data[late] is None:
                del data[late]
        return dict(sorted(data.items()))

    def stable_id(self) -> str:
        """12 hex digits of sha256 over the canonical JSON: identical across machines/runs."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def pytest_id(self) -> str:
        """A readable id, e.g. ``fwd_bwd-K4-L65-C40-B2-chlast-silu-bias-bf16w32-init``."""
        parts = [self.op, f"K{self.width}"]
        if self.seqlen is not None:
            parts.append(f"L{self.seqlen}")
        if self.op == "update":
            parts.append(f"T{self.tokens}x{self.steps}-S{self.state_len}")
        parts += [f"C{self.dim}", f"B{self.batch}"]
        parts.append("chlast" if self.layout == "channel_last" else "chfirst")
        if self.gap:
            parts.append(self.gap.replace("_", ""))
        parts.append(self.activation or "noact")
        parts.append("bias" if self.bias else "nobias")
        parts.append(f"{short_name(self.x_dtype)}w{short_name(self.w_dtype).lstrip('f')}")
        if self.initial_state and self.initial_state != "none":
            parts.append("init" if self.initial_state == "random" else "init0")
        if self.final_state:
            parts.append("final" + ("-dF" if self.dfinal == "random" else ""))
        if self.seq_lens is not None:
            parts.append("packed" + ".".join(str(n) for n in self.seq_lens))
        if self.circular:
            parts.append("ring")
        if self.slots and self.slots != "identity":
            parts.append(self.slots.replace("_", ""))
        if self.grad_layout:
            parts.append(f"dy{self.grad_layout}")
        if self.expect == "error":
            parts.append("xerr")
        return "-".join(parts) + f"-{self.id[:6]}"

    # -- what it needs --------------------------------------------------------------------
    def required_features(self) -> frozenset[str]:
        """Kernel features (see ``convmatrix.core.contract.FEATURES``) this case exercises."""
        need: set[str] = set()
        if self.op == "fwd_bwd":
            need.add("backward")
        if self.op == "update":
            need.add("update")
            if self.circular:
                need.add("ring_buffer")
            if self.slots and self.slots != "identity":
                need.add("slot_indices")
        if self.initial_state and self.initial_state != "none":
            need.add("initial_state")
        if self.final_state:
            need.add("final_state")
        if self.seq_lens is not None:
            need.add("packed")
        return frozenset(need)

    def to_json(self) -> dict[str, Any]:
        """Every field, as written by ``convmatrix expand --format jsonl``. Field by field,
        not ``dataclasses.asdict`` (its deep copy is most of the cost of storing a result)."""
        data = {name: getattr(self, name) for name in _field_names()}
        if data["seq_lens"] is not None:
            data["seq_lens"] = list(data["seq_lens"])
        data["checks"] = list(data["checks"])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if kwargs.get("seq_lens") is not None:
            kwargs["seq_lens"] = tuple(kwargs["seq_lens"])
        kwargs["checks"] = tuple(kwargs.get("checks", ()))
        return cls(**kwargs)


@cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Case))
