"""The search space a strategy draws from: dimension sizes plus constraints over value indices.

Strategies see dimensions as ``0..size-1`` and constraints as predicates over the few
dimensions each reads, so they stay independent of YAML and symbols and can be property-tested
on random small spaces. Constraint results are memoised per (constraint, values): the
covering-array generator asks the same small questions many times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Constraint", "SearchBudgetExceeded", "Space"]

Partial = list  # list[int | None]: value index per dimension, None = not chosen yet


@dataclass(frozen=True)
class Constraint:
    """``check(values)`` gets the value indices of ``dims`` (in that order): reason or None."""

    dims: tuple[int, ...]
    check: Callable[[tuple[int, ...]], str | None]


class SearchBudgetExceeded(RuntimeError):
    """The constraints are too intricate to complete a combination within the node budget."""


class Space:
    def __init__(
        self,
        sizes: Sequence[int],
        constraints: Sequence[Constraint] = (),
        budget: int = 200_000,
    ) -> None:
        self.sizes = tuple(sizes)
        self.constraints = tuple(constraints)
        self.budget = budget
        self._by_dim: list[list[int]] = [[] for _ in self.sizes]
        for index, constraint in enumerate(self.constraints):
            for dim in constraint.dims:
                self._by_dim[dim].append(index)
        self._memo: dict[tuple[int, tuple[int, ...]], str | None] = {}
        self.last_reason: str | None = None

    def _violation(self, index: int, partial: Partial) -> str | None:
        constraint = self.constraints[index]
        values = tuple(partial[d] for d in constraint.dims)
        if None in values:
            return None
        key = (index, values)
        if key not in self._memo:
            self._memo[key] = constraint.check(values)
        return self._memo[key]

    def violation_at(self, partial: Partial, dim: int) -> str | None:
        """First violated constraint that reads ``dim`` and is fully assigned in ``partial``."""
        for index in self._by_dim[dim]:
            reason = self._violation(index, partial)
            if reason is not None:
                return reason
        return None

    def violation(self, partial: Partial) -> str | None:
        """First violated, fully assigned constraint of ``partial``."""
        for index in range(len(self.constraints)):
            reason = self._violation(index, partial)
            if reason is not None:
                return reason
        return None

    def complete(self, partial: Partial) -> list[int] | None:
        """A valid full combination extending ``partial`` (which must itself be consistent),
        or None; ``last_reason`` then holds the last violation seen, for messages."""
        work = list(partial)
        nodes = [0]
        found = self._search(work, nodes)
        return work if found else None

    def _pick_dim(self, work: Partial) -> int:
        # Most constrained first: the dim closing the most constraints fails earliest.
        best, best_score = -1, -1
        for dim, value in enumerate(work):
            if value is not None:
                continue
            score = 0
            for index in self._by_dim[dim]:
                dims = self.constraints[index].dims
                if all(work[d] is not None or d == dim for d in dims):
                    score += 1
            if score > best_score:
                best, best_score = dim, score
        return best

    def _search(self, work: Partial, nodes: list[int]) -> bool:
        dim = self._pick_dim(work)
        if dim < 0:
            return True
        for value in range(self.sizes[dim]):
            nodes[0] += 1
            if nodes[0] > self.budget:
                raise SearchBudgetExceeded(f"more than {self.budget} search nodes")
            work[dim] = value
            reason = self.violation_at(work, dim)
            if reason is None and self._search(work, nodes):
                return True
            if reason is not None:
                self.last_reason = reason
        work[dim] = None
        return False

    def is_extendable(self, partial: Partial) -> bool:
        return self.violation(partial) is None and self.complete(partial) is not None
