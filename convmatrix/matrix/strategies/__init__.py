"""Expansion strategies behind one small protocol, chosen by name from ``STRATEGIES``.

A strategy turns a ``Space`` (dimension sizes + constraints) into rows of value indices. It
must be deterministic for a seed and identical in every process: pytest-xdist expands the
matrix in each worker and the workers must agree on the cases. So strategies use
``random.Random(seed)`` and ordered containers only, never set or hash order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from convmatrix.matrix.strategies.full import Full
from convmatrix.matrix.strategies.pairwise import Pairwise
from convmatrix.matrix.strategies.space import Constraint, SearchBudgetExceeded, Space
from convmatrix.matrix.strategies.twise import TWise

__all__ = [
    "STRATEGIES",
    "Constraint",
    "SearchBudgetExceeded",
    "Space",
    "Strategy",
    "make_strategy",
]


class Strategy(Protocol):
    name: str

    def generate(self, space: Space, seed: int) -> list[tuple[int, ...]]:
        """Valid rows (one value index per dimension), deterministic for ``seed``."""
        ...

    def describe(self) -> str:
        """E.g. ``pairwise`` or ``twise(t=3)``, for reports."""
        ...


# name -> (factory, parameters it accepts)
STRATEGIES: Mapping[str, tuple[Callable[..., Strategy], tuple[str, ...]]] = {
    "full": (Full, ()),
    "pairwise": (Pairwise, ()),
    "twise": (TWise, ("t",)),
}


def make_strategy(name: str, params: Mapping[str, Any] | None = None) -> Strategy:
    """The strategy ``name`` with ``params``; KeyError/TypeError are turned into matrix
    errors by the caller, which knows the file position."""
    factory, accepted = STRATEGIES[name]
    params = dict(params or {})
    unknown = [k for k in params if k not in accepted]
    if unknown:
        raise TypeError(f"strategy {name!r} takes no parameter {unknown[0]!r}")
    return factory(**params)
