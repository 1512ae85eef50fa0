"""``full``: the cartesian product of every dimension, minus invalid combinations."""

from __future__ import annotations

from convmatrix.matrix.strategies.space import Space

__all__ = ["Full"]


class Full:
    name = "full"

    def generate(self, space: Space, seed: int) -> list[tuple[int, ...]]:
        """Every valid row in lexicographic order (first dimension slowest). ``seed`` unused."""
        rows: list[tuple[int, ...]] = []
        work: list[int | None] = [None] * len(space.sizes)

        def descend(dim: int) -> None:
            if dim == len(space.sizes):
                rows.append(tuple(work))  # type: ignore[arg-type]
                return
            for value in range(space.sizes[dim]):
                work[dim] = value
                if space.violation_at(work, dim) is None:
                    descend(dim + 1)
            work[dim] = None

        descend(0)
        return rows

    def describe(self) -> str:
        return "full"
