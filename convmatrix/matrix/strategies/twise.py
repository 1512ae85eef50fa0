"""``twise``: a covering array of strength t under constraints (AETG-style greedy).

Every t-tuple of values (one value from each of t distinct dimensions) that some valid row
can contain appears in at least one row. Rows are built one at a time: seed the row with the
first uncovered tuple, then fill the other dimensions in a seeded random order, each with the
value that covers the most still-uncovered tuples while the row stays completable under the
constraints. A tuple no valid row can contain is dropped, not covered. Of a few candidate rows
the best is kept. Everything iterates lists and insertion-ordered dicts, and randomness comes
from ``random.Random(seed)``: the same rows in every process.
"""

from __future__ import annotations

import itertools
import random

from convmatrix.matrix.strategies.space import Space

__all__ = ["TWise"]

_CANDIDATES = 3  # rows tried per step; more gives slightly fewer rows, linearly slower


class TWise:
    name = "twise"

    def __init__(self, t: int = 2) -> None:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"t must be a positive integer, got {t!r}")
        self.t = t

    def describe(self) -> str:
        return f"twise(t={self.t})"

    def generate(self, space: Space, seed: int) -> list[tuple[int, ...]]:
        n = len(space.sizes)
        t = min(self.t, n)
        combos = list(itertools.combinations(range(n), t))
        by_dim: list[list[int]] = [[] for _ in range(n)]
        for ci, dims in enumerate(combos):
            for d in dims:
                by_dim[d].append(ci)
        uncovered: list[dict[tuple[int, ...], None]] = [
            dict.fromkeys(itertools.product(*(range(space.sizes[d]) for d in dims)))
            for dims in combos
        ]
        rng = random.Random(seed)
        rows: list[tuple[int, ...]] = []
        cursor = 0
        while True:
            while cursor < len(combos) and not uncovered[cursor]:
                cursor += 1
            if cursor == len(combos):
                break
            values = next(iter(uncovered[cursor]))
            start: list[int | None] = [None] * n
            for d, v in zip(combos[cursor], values, strict=True):
                start[d] = v
            if not space.is_extendable(start):
                del uncovered[cursor][values]  # no valid row contains this tuple
                continue
            best: list[int] | None = None
            best_gain = -1
            for _ in range(_CANDIDATES):
                row = self._fill(space, list(start), rng, combos, by_dim, uncovered)
                gain = _gain_of_row(row, combos, uncovered)
                if gain > best_gain:
                    best, best_gain = row, gain
            assert best is not None
            for ci, dims in enumerate(combos):
                uncovered[ci].pop(tuple(best[d] for d in dims), None)
            rows.append(tuple(best))
        return rows

    @staticmethod
    def _fill(
        space: Space,
        row: list[int | None],
        rng: random.Random,
        combos: list[tuple[int, ...]],
        by_dim: list[list[int]],
        uncovered: list[dict[tuple[int, ...], None]],
    ) -> list[int]:
        order = [d for d in range(len(row)) if row[d] is None]
        rng.shuffle(order)
        for dim in order:
            candidates = list(range(space.sizes[dim]))
            rng.shuffle(candidates)  # random tie-break among equal gains
            gains = []
            for value in candidates:
                row[dim] = value
                gains.append(_gain_at(row, dim, combos, by_dim, uncovered))
            pairs = sorted(zip(gains, candidates, strict=True), key=lambda p: -p[0])
            ranked = [v for _, v in pairs]
            for value in ranked:
                row[dim] = value
                if space.violation_at(row, dim) is None and space.complete(row) is not None:
                    break
            else:  # unreachable: the row was completable before this dimension
                raise AssertionError("covering array: row became incompletable")
        return row  # type: ignore[return-value]


def _gain_at(
    row: list[int | None],
    dim: int,
    combos: list[tuple[int, ...]],
    by_dim: list[list[int]],
    uncovered: list[dict[tuple[int, ...], None]],
) -> int:
    """Uncovered tuples through ``dim`` whose other dimensions are already set in ``row``."""
    gain = 0
    for ci in by_dim[dim]:
        values = tuple(row[d] for d in combos[ci])
        if None not in values and values in uncovered[ci]:
            gain += 1
    return gain


def _gain_of_row(
    row: list[int], combos: list[tuple[int, ...]], uncovered: list[dict[tuple[int, ...], None]]
) -> int:
    return sum(tuple(row[d] for d in dims) in uncovered[ci] for ci, dims in enumerate(combos))
