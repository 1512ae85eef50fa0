"""Expansion strategies on random small spaces, checked against brute force.

The oracle enumerates the whole cartesian product: a row is valid when no constraint rejects
it, a t-tuple is valid when some valid row contains it. ``pairwise``/``twise`` must cover every
valid tuple with valid rows only; ``full`` must return exactly the valid rows.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from convmatrix.matrix.strategies import STRATEGIES, Constraint, Space, make_strategy
from convmatrix.matrix.strategies.full import Full
from convmatrix.matrix.strategies.pairwise import Pairwise
from convmatrix.matrix.strategies.twise import TWise


@st.composite
def spaces(draw, max_dims: int = 5, max_size: int = 4):
    """Sizes plus 'exclude' constraints: partial rows (1-3 dims) that make a row invalid."""
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_dims))
    excludes = []
    for _ in range(draw(st.integers(0, 4))):
        dims = draw(
            st.lists(
                st.integers(0, len(sizes) - 1),
                min_size=1,
                max_size=min(3, len(sizes)),
                unique=True,
            )
        )
        dims.sort()
        values = tuple(draw(st.integers(0, sizes[d] - 1)) for d in dims)
        excludes.append((tuple(dims), values))
    return sizes, excludes


def _space(sizes, excludes) -> Space:
    def make(values):
        return lambda got: "excluded" if got == values else None

    return Space(sizes, [Constraint(dims, make(values)) for dims, values in excludes])


def _valid_rows(sizes, excludes) -> list[tuple[int, ...]]:
    rows = []
    for row in itertools.product(*(range(n) for n in sizes)):
        if not any(tuple(row[d] for d in dims) == vals for dims, vals in excludes):
            rows.append(row)
    return rows


def _tuples(rows, t: int, n: int) -> set:
    found = set()
    for dims in itertools.combinations(range(n), min(t, n)):
        for row in rows:
            found.add((dims, tuple(row[d] for d in dims)))
    return found


@settings(max_examples=150, deadline=None)
@given(spaces())
def test_pairwise_covers_every_valid_pair(space_def):
    sizes, excludes = space_def
    rows = Pairwise().generate(_space(sizes, excludes), seed=7)
    valid = _valid_rows(sizes, excludes)
    assert set(rows) <= set(valid), "pairwise produced an excluded row"
    assert _tuples(valid, 2, len(sizes)) <= _tuples(rows, 2, len(sizes))
    if valid:
        assert len(rows) <= len(valid)  # never worse than the full product
    else:
        assert rows == []


@settings(max_examples=40, deadline=None)
@given(spaces(max_dims=4, max_size=3))
def test_three_wise_covers_every_valid_triple(space_def):
    sizes, excludes = space_def
    rows = TWise(t=3).generate(_space(sizes, excludes), seed=1)
    valid = _valid_rows(sizes, excludes)
    assert set(rows) <= set(valid)
    assert _tuples(valid, 3, len(sizes)) <= _tuples(rows, 3, len(sizes))


@settings(max_examples=60, deadline=None)
@given(spaces())
def test_full_is_exactly_the_valid_product(space_def):
    sizes, excludes = space_def
    assert Full().generate(_space(sizes, excludes), seed=0) == _valid_rows(sizes, excludes)


@settings(max_examples=30, deadline=None)
@given(spaces(), st.integers(0, 2**31))
def test_same_seed_same_rows(space_def, seed):
    sizes, excludes = space_def
    first = Pairwise().generate(_space(sizes, excludes), seed)
    assert Pairwise().generate(_space(sizes, excludes), seed) == first


def test_pairwise_is_much_smaller_than_full():
    # 10 dimensions of 3 values: 59049 rows in full; a pairwise array needs at least 9.
    sizes = [3] * 10
    rows = Pairwise().generate(Space(sizes), seed=0)
    assert 9 <= len(rows) <= 25
    every_row = list(itertools.product(*(range(3) for _ in sizes)))
    assert _tuples(rows, 2, 10) == _tuples(every_row, 2, 10)


def test_strategies_are_chosen_by_name():
    assert set(STRATEGIES) == {"full", "pairwise", "twise"}
    assert make_strategy("twise", {"t": 3}).describe() == "twise(t=3)"
    assert make_strategy("pairwise").describe() == "pairwise"
