"""``pairwise``: every valid pair of values of any two dimensions appears in some case."""

from __future__ import annotations

from convmatrix.matrix.strategies.twise import TWise

__all__ = ["Pairwise"]


class Pairwise(TWise):
    name = "pairwise"

    def __init__(self) -> None:
        super().__init__(t=2)

    def describe(self) -> str:
        return "pairwise"
