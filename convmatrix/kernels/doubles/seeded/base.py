"""The seeded-bug kernel: the ``tiled`` kernel with one hook replaced.

A seeded kernel is ``tiled`` (a correct kernel the whole matrix passes) plus exactly one bug,
written as an override of one of the hooks below, each a few lines. The hooks sit where a
real kernel goes wrong: what the tile loop reads (``mutate_inputs``: weights, strides,
sequence ids), what it stores (``mutate_outputs``), what the backward reads and reduces
(``mutate_grad_inputs``, ``mutate_grads``, ``silu_grad``) and the decode update's three steps
(``read_history``, ``write_history``, ``update_forward``, or ``update`` itself).

Every seeded kernel carries a ``Bug``: its name, bug class, the dimension of docs/spec.md §3
meant to catch it, where it comes from (the seed's table, or an upstream issue or commit from
../shared/research/upstream_bugs.md), a small case that triggers it and, where one exists, a
case on which it cannot show (``tests/test_seeded.py`` runs both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from convmatrix.kernels.builtin.tiled.backward import Gradients, tiled_backward
from convmatrix.kernels.builtin.tiled.forward import tiled_forward
from convmatrix.kernels.builtin.tiled.kernel import TiledKernel
from convmatrix.kernels.interface.semantics import check_forward_args, is_silu

__all__ = ["DIMENSIONS", "Bug", "Call", "SeededKernel", "Threshold"]


# The rows of docs/spec.md §3 (plus the gradient layout dimension) a bug is meant for.
DIMENSIONS = (
    "width K",
    "length L",
    "channels C",
    "batch B",
    "layout",
    "activation",
    "parameters",
    "state",
    "packed",
    "update",
    "grad_layout",
    "size",  # elements of a tensor: what no dimension of its own reaches (size_bugs.py)
)


@dataclass(frozen=True)
class Threshold:
    """Where a size bug starts: the case passes while ``quantity`` is at most ``limit`` and
    fails past it. ``quantity`` is a product of ``Case`` fields (``"batch*seqlen"``,
    ``"batch*dim*seqlen"``, ``"dim"``): what the kernel's arithmetic runs out of."""

    quantity: str
    limit: int

    def of(self, case: Any) -> int:
        """The quantity's value for ``case``."""
        value = 1
        for name in self.quantity.split("*"):
            value *= int(getattr(case, name) or 0)
        return value

    def __str__(self) -> str:
        return f"{self.quantity} > {self.limit}"


@dataclass(frozen=True)
class Bug:
    """What a seeded kernel gets wrong, and how the matrix is meant to see it.

    ``trigger`` and ``quiet`` are ``Case`` fields over the small base cases of
    ``convmatrix.kernels.doubles.seeded.base_case``: ``trigger`` is a case the bug must fail,
    ``quiet`` one it must pass because its bug cannot show there (None: it shows on every case).
    """

    name: str
    bug_class: str
    dimension: str  # one of DIMENSIONS
    source: str  # "seed table" or the upstream issue/commit
    trigger: Mapping[str, Any]
    quiet: Mapping[str, Any] | None = None
    reach: str = ""  # the dimension value(s) a case needs to reach it (for survivors)
    threshold: Threshold | None = None  # a size bug's: where it starts (size_bugs.py)

    def __post_init__(self) -> None:
        if self.dimension not in DIMENSIONS:
            raise ValueError(f"bug {self.name}: unknown dimension {self.dimension!r}")


@dataclass(frozen=True)
class Call:
    """One forward call's arguments as the tile loop sees them."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    initial_state: torch.Tensor | None
    seq_idx: torch.Tensor | None
    silu: bool
    final_requested: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> Call:
        return dataclasses.replace(self, **changes)


def _operands(call: Call) -> tuple[Any, ...]:
    """(x, weight, bias, initial_state, seq_idx, silu): what the tile loops take first."""
    return (call.x, call.weight, call.bias, call.initial_state, call.seq_idx, call.silu)


class SeededFunction(torch.autograd.Function):
    """``TiledFunction`` with the kernel's hooks around the forward and the backward."""

    @staticmethod
    def forward(ctx, kernel, call, x, weight, bias, initial_state):  # type: ignore[override]
        used = kernel.mutate_inputs(call)
        y, final = kernel.forward_of(used)
        y, final = kernel.mutate_outputs(used, y, final)
        ctx.kernel, ctx.call = kernel, call
        return y, final

    @staticmethod
    def backward(ctx, grad_y, grad_final):  # type: ignore[override]
        kernel = ctx.kernel
        used = kernel.mutate_inputs(ctx.call)
        grad_y, grad_final = kernel.mutate_grad_inputs(used, grad_y, grad_final)
        grads = kernel.backward_of(used, grad_y, grad_final)
        dx, dw, db, ds = kernel.mutate_grads(used, grads, grad_y, grad_final)
        return None, None, dx, dw, db, ds


class SeededKernel(TiledKernel):
    """``tiled`` with one bug. Subclasses set ``bug`` and override one hook."""

    bug: ClassVar[Bug]
    silu_grad: ClassVar[Callable[[torch.Tensor], torch.Tensor] | None] = None

    def __init__(self, geometry: Any = None, **overrides: int) -> None:
        super().__init__(geometry, **overrides)
        self.name = f"seeded:{self.bug.name}"

    # -- hooks (identity in the correct kernel) -----------------------------------------------
    def mutate_inputs(self, call: Call) -> Call:
        return call

    def mutate_outputs(
        self, call: Call, y: torch.Tensor, final: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return y, final

    def mutate_grad_inputs(
        self, call: Call, grad_y: torch.Tensor, grad_final: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return grad_y, grad_final

    def mutate_grads(
        self,
        call: Call,
        grads: Gradients,
        grad_y: torch.Tensor,
        grad_final: torch.Tensor | None,
    ) -> Gradients:
        return grads

    # -- plumbing ---------------------------------------------------------------------------
    def backward_of(
        self, call: Call, grad_y: torch.Tensor, grad_final: torch.Tensor | None
    ) -> Gradients:
        """The tiled backward of ``call`` (hooks may call it again on altered arguments)."""
        return tiled_backward(*_operands(call), self.geometry, grad_y, grad_final, self.silu_grad)

    def forward_of(self, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        """The correct tiled forward of ``call`` (for hooks that recompute part of y)."""
        return tiled_forward(*_operands(call), self.geometry)

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
        check_forward_args(x, weight, bias, initial_state, seq_idx, activation)
        call = Call(
            x, weight, bias, initial_state, seq_idx, is_silu(activation), return_final_state
        )
        y, final = SeededFunction.apply(self, call, x, weight, bias, initial_state)
        return (y, final) if return_final_state else y

    def core_call(self, args: Any) -> Any:
        raise NotImplementedError("seeded-bug kernels are for correctness runs, not timing")

    def describe(self) -> Mapping[str, Any]:
        bug = self.bug
        return {
            **super().describe(),
            "seeded_bug": bug.name,
            "bug_class": bug.bug_class,
            "dimension": bug.dimension,
            "source": bug.source,
        }
