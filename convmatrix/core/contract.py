"""A kernel's declared contract: what it accepts, which features it has, its tile geometry.

Plain data, below the matrix language: the matrix classifies cases against it (a case outside
the contract is an expected-error case, a missing feature a skip) and kernels declare it.
``ContractError`` is what a kernel raises for inputs outside its contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from convmatrix.core.case import Case
from convmatrix.core.dtypes import CASE_DTYPES

__all__ = [
    "ALL_DTYPE_PAIRS",
    "FEATURES",
    "LAYOUTS",
    "Capabilities",
    "ContractError",
    "DeclaredKernel",
    "Geometry",
]

ALL_DTYPE_PAIRS = frozenset((x, w) for x in CASE_DTYPES for w in CASE_DTYPES)
LAYOUTS = frozenset({"channel_first", "channel_last"})
FEATURES = frozenset(
    {
        "backward",  # outputs differentiable w.r.t. x, weight, bias, initial_state
        "initial_state",
        "final_state",
        "packed",  # seq_idx
        "update",  # decode update with a shifting state
        "ring_buffer",  # update with cache_seqlens
        "slot_indices",  # update with state_indices (continuous batching)
    }
)


class ContractError(ValueError):
    """Raised by a kernel for inputs outside its declared contract.

    Distinct from a crash or a wrong answer: an expected-error case passes only when the kernel
    raises this (or the kernel's documented exception, see ``Capabilities.error_types``).
    """


@dataclass(frozen=True)
class Geometry:
    """Tile geometry a kernel declares; the matrix resolves symbolic values from it.

    ``time_tile`` is T, ``channel_tile`` C_t, ``vector_width`` the channel vector width,
    ``partial_groups`` P (per-channel partial sums of dw/db). ``None`` means "not declared":
    a matrix that uses e.g. ``tile+1`` against such a kernel gets a clear error.
    """

    time_tile: int | None = None
    channel_tile: int | None = None
    vector_width: int | None = None
    partial_groups: int | None = None

    def symbols(self) -> dict[str, int]:
        """Symbol name → value for the declared parts (``tile``, ``ctile``, ``vec``, ``P``)."""
        names = {
            "tile": self.time_tile,
            "ctile": self.channel_tile,
            "vec": self.vector_width,
            "P": self.partial_groups,
        }
        return {k: v for k, v in names.items() if v is not None}


@dataclass(frozen=True)
class Capabilities:
    """A kernel's declared contract. ``widths=None`` means any width >= 1."""

    widths: frozenset[int] | None = None
    dtype_pairs: frozenset[tuple[str, str]] = ALL_DTYPE_PAIRS
    layouts: frozenset[str] = LAYOUTS
    features: frozenset[str] = FEATURES
    geometry: Geometry = field(default_factory=Geometry)
    # Exceptions other than ContractError that the kernel documents for contract violations
    # (e.g. Dao's extension raises RuntimeError from TORCH_CHECK).
    error_types: tuple[type[BaseException], ...] = ()

    def missing_features(self, case: Case) -> list[str]:
        """Features the case needs that the kernel lacks: such cases are skipped, not failed."""
        return sorted(case.required_features() - self.features)

    def contract_violation(self, case: Case) -> str | None:
        """Why the declared contract rejects this case, or None. Rejected = expected error."""
        if self.widths is not None and case.width not in self.widths:
            return f"width {case.width} not in {sorted(self.widths)}"
        if (case.x_dtype, case.w_dtype) not in self.dtype_pairs:
            return f"dtype pair ({case.x_dtype}, {case.w_dtype}) not supported"
        if case.layout not in self.layouts:
            return f"layout {case.layout} not supported"
        return None


class DeclaredKernel(Protocol):
    """What the matrix needs of a kernel to expand cases for it: its name, its declared
    geometry (``capabilities.geometry`` resolves ``tile+1``...) and its contract. Every kernel
    (``convmatrix.kernels.protocol.Kernel``) is one."""

    name: str
    capabilities: Capabilities

    def contract_violation(self, case: Case) -> str | None: ...
