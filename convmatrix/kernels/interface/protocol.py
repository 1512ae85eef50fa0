"""The kernel protocol: what every kernel under test declares and implements.

A kernel is held to the semantics of docs/spec.md §2 through two canonical, Dao-compatible calls,
``forward`` and ``update``. It *declares* its contract (``Capabilities``: widths, dtype pairs,
layouts, features, tile geometry, decode state lengths, tokens per update, its final state
under packing, outputs written into inputs, its pad slot id) so the matrix can classify a case
the kernel is not meant to accept as an expected-error case instead of sending it to numeric
comparison, and the runners never call it outside what it declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from convmatrix.core.case import Case
from convmatrix.core.contract import (
    ALL_DTYPE_PAIRS,
    FEATURES,
    LAYOUTS,
    STATE_LEN_ANY,
    STATE_LEN_K,
    STATE_LEN_K_MINUS_1,
    Capabilities,
    ContractError,
    Geometry,
    StateLens,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALL_DTYPE_PAIRS",
    "FEATURES",
    "LAYOUTS",
    "STATE_LEN_ANY",
    "STATE_LEN_K",
    "STATE_LEN_K_MINUS_1",
    "Capabilities",
    "ContractError",
    "Geometry",
    "Kernel",
    "KernelBase",
    "StateLens",
]


@runtime_checkable
class Kernel(Protocol):
    """What a kernel under test implements. See docs/spec.md §2 for the exact semantics."""

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
    # The module whose code is under test, for the run's recorded version and commit
    # (``runners.run.provenance``): an adapter names the library it calls; None: the class's module.
    source_module: str | None = None

    def availability(self) -> str | None:
        return None

    def contract_violation(self, case: Case) -> str | None:
        return self.capabilities.contract_violation(case)

    def update(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise ContractError(f"kernel {self.name!r} has no decode update")

    def core_call(self, args: Any) -> Any:
        """The optional timing hook (``convmatrix.kernels.interface.corecall``): a zero-argument
        closure of the core computation on pre-converted inputs, or None when there is none."""
        return None

    def describe(self) -> Mapping[str, Any]:
        """Metadata stored with a run (versions, geometry); kernels add their own keys."""
        return {"name": self.name, "geometry": self.capabilities.geometry.symbols()}

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"
