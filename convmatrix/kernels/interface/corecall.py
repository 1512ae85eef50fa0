"""The optional ``core_call`` hook: a kernel's core computation alone, for the ``kernel`` scope.

docs/spec.md §5 times three scopes. The ``op`` scope is the public call (``forward``/``update`` plus
autograd) from the case's canonical inputs; the ``kernel`` scope is the adapter's *core* on
inputs already in the layout and dtype it wants, so that layout conversion, dtype casts,
argument checks and state bookkeeping show up as the difference between the two.

Only the adapter knows where its core begins, hence a hook::

    kernel.core_call(args: CoreArgs) -> Callable[[], object] | None

It does every conversion *now* (outside any timed region) and returns a zero-argument closure
that runs just the core on the converted inputs; ``None`` means "no separable core for these
arguments" and the timing falls back to the op call on contiguous inputs, recorded under its
own scope name so the two are never compared (``convmatrix.runners.case.timing.scopes``).
``KernelBase`` returns ``None``; ``torch``, ``reference`` and ``tiled`` implement it.

``op`` is ``fwd``, ``fwd_bwd`` (forward then backward), ``bwd`` (the backward alone: whatever
the forward leaves behind is computed before the closure is returned) or ``update`` (the
arithmetic of one decode step on the already-gathered history, without writing the state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from convmatrix.kernels.interface.semantics import is_silu

__all__ = ["CORE_OPS", "CoreArgs", "CoreCall", "core_call_of", "update_history"]

CORE_OPS = ("fwd", "fwd_bwd", "bwd", "update")

CoreCall = Callable[[], object]


@dataclass(frozen=True)
class CoreArgs:
    """Canonical arguments of one core call (shapes as in docs/spec.md §2).

    Forward ops: ``x`` (B, C, L), ``initial_state`` (B, C, K-1), ``seq_idx`` (B, L),
    ``grad_y`` (B, C, L) and ``grad_final`` (B, C, K-1) for ``fwd_bwd``/``bwd``.
    ``update``: ``x`` (B, C, T) new tokens, ``conv_state`` (B_pool, C, S) and the optional
    ``cache_seqlens`` (B,) / ``state_indices`` (B,).
    """

    op: str
    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = None
    initial_state: torch.Tensor | None = None
    seq_idx: torch.Tensor | None = None
    return_final_state: bool = False
    grad_y: torch.Tensor | None = None
    grad_final: torch.Tensor | None = None
    conv_state: torch.Tensor | None = None
    cache_seqlens: torch.Tensor | None = None
    state_indices: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.op not in CORE_OPS:
            raise ValueError(f"CoreArgs.op {self.op!r}: one of {', '.join(CORE_OPS)}")

    @property
    def silu(self) -> bool:
        return is_silu(self.activation)


def core_call_of(kernel: Any) -> Callable[[CoreArgs], CoreCall | None] | None:
    """The kernel's ``core_call`` hook, or None for a kernel that does not define one."""
    hook = getattr(kernel, "core_call", None)
    return hook if callable(hook) else None


def update_history(args: CoreArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """(live new tokens (B_live, C, T), their K-1 newest cached tokens (B_live, C, K-1) in x's
    dtype): the gather every update does before its arithmetic, done here untimed."""
    from convmatrix.kernels.interface.semantics import decode_prefix, pool_rows

    assert args.conv_state is not None, "update core calls need conv_state"
    batch = args.x.shape[0]
    live, rows = pool_rows(args.state_indices, batch, args.x.device)
    state = args.conv_state.index_select(0, rows)
    seqlens = None if args.cache_seqlens is None else args.cache_seqlens.to(args.x.device)[live]
    prefix = decode_prefix(state, args.weight.shape[1], seqlens).to(args.x.dtype)
    return args.x.index_select(0, live).contiguous(), prefix.contiguous()
