"""The kernel protocol: what every kernel under test declares and implements.

A kernel is held to the semantics of SPEC.md §2 through two canonical, Dao-compatible calls,
``forward`` and ``update``. It *declares* its contract (widths, dtype pairs, layouts, features,
tile geometry) so the matrix can classify a case the kernel is not meant to accept as an
expected-error case instead of sending it to numeric comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from convmatrix.matrix.case import Case

__all__ = [
    "ALL_DTYPE_PAIRS",
    "FEATURES",
    "LAYOUTS",
    "Capabilities",
    "ContractError",
    "Geometry",
    "Kernel",
    "KernelBase",
]

DTYPES = ("float32", "float16", "bfloat16")
ALL_DTYPE_PAIRS = frozenset((x, w) for x in DTYPES for w in DTYPES)
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


@runtime_checkable
class Kernel(Protocol):
    """What a kernel under test implements. See SPEC.md §2 for the exact semantics."""

    name: str
    capabilities: Capabilities

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
        """``x`` (B, C, L) any strides → ``y`` (B, C, L) [, final_state (B, C, K-1)]."""
        ...

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
        """Decode ``x`` (B, C, T) against ``conv_state`` (B_pool, C, S), mutating it in place."""
        ...

    def availability(self) -> str | None:
        """None when usable on this machine, else the reason (e.g. a failed lazy import)."""
        ...

    def contract_violation(self, case: Case) -> str | None:
        """Why this kernel's contract rejects the case (an expected-error case), or None."""
        ...


class KernelBase:
    """Defaults for the optional parts of the protocol; kernels may subclass it."""

    name: str = "kernel"
    capabilities: Capabilities = Capabilities()

    def availability(self) -> str | None:
        return None

    def contract_violation(self, case: Case) -> str | None:
        return self.capabilities.contract_violation(case)

    def update(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise ContractError(f"kernel {self.name!r} has no decode update")

    def core_call(self, args: Any) -> Any:
        """The optional timing hook (``convmatrix.kernels.corecall``): a zero-argument closure
        of the core computation on pre-converted inputs, or None when there is none."""
        return None

    def describe(self) -> Mapping[str, Any]:
        """Metadata stored with a run (versions, geometry); kernels add their own keys."""
        return {"name": self.name, "geometry": self.capabilities.geometry.symbols()}

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"
