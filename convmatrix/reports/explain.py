"""Where it fails: the dimension values that separate a run's failing cases from its passing ones.

A pivot shows every group; an explanation names the one that matters. For each dimension of
``reports.dimensions`` (lengths by their relation to the tile, layouts, dtypes, ...) and each
fact of the call of ``reports.facts`` (whether x, dy or the state reach the kernel contiguous,
the first sequence against K-1, L against the declared tile) the cases are grouped by their
label and the set of labels that best separates failing from passing is
found: "the case has one of these values" should hold for every failing case and for no
passing one. Its score is the Jaccard index of the two sets,

    score = failing_in / (failing + passing_in),

1 for a perfect separation, lower for every failing case it misses and every passing case it
takes in. The best set of one dimension is a prefix of its labels sorted by failing share
(the fractional-knapsack order, optimal for this ratio). Single dimensions come first; a pair
of dimensions (labels ``a / b``) is offered only where it scores clearly higher than every
single dimension, so an interaction (a tile-boundary bug that shows with one layout only) is
named and a coincidence is not. At equal scores a matrix dimension goes before a fact.

Fewer than ``MIN_FAILING`` failing cases explain nothing: any two cases share some values, and
"dtype × layout in {...}: 2 of 2" reads like a finding. They get one record saying so
(``Explanation.too_few``, no dimensions). Pure: cases and ids in, plain records out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from convmatrix.core.case import Case
from convmatrix.reports.dimensions import DIMENSIONS, ORDER
from convmatrix.reports.facts import FACTS

__all__ = ["CANDIDATES", "MIN_FAILING", "PAIR_MARGIN", "Explanation", "explain"]

PAIR_MARGIN = 0.15  # a pair must beat the best single dimension's score by this much
MIN_FAILING = 3  # fewer failing cases than this explain nothing
CANDIDATES = {**DIMENSIONS, **FACTS}  # what an explanation may name, dimensions first


@dataclass(frozen=True)
class Explanation:
    """A set of values of one or two dimensions, and how well it separates the failing cases."""

    dimensions: tuple[str, ...]
    values: tuple[str, ...]  # labels (a pair's as "a / b")
    failing_in: int  # failing cases that have one of these values
    failing: int  # failing cases in all
    passing_in: int  # passing cases that have one of these values
    passing: int  # passing cases in all
    score: float  # failing_in / (failing + passing_in)

    @classmethod
    def too_few(cls, failing: int, passing: int) -> Explanation:
        """The record of an explanation not attempted: ``failing`` < ``MIN_FAILING``."""
        return cls((), (), 0, failing, 0, passing, 0.0)

    def text(self) -> str:
        """``seqlen in {tile+1, 2*tile+1}: 15 of 15 failing cases, 0 of 40 passing``."""
        if not self.dimensions:
            return (
                f"too few cases to explain: {self.failing} failing (at least {MIN_FAILING} needed)"
            )
        name = " × ".join(self.dimensions)
        shown = ", ".join(self.values)
        return (
            f"{name} in {{{shown}}}: {self.failing_in} of {self.failing} failing cases, "
            f"{self.passing_in} of {self.passing} passing"
        )


def _best_set(
    dims: tuple[str, ...], failing: Counter[str], passing: Counter[str], n_f: int, n_p: int
) -> Explanation | None:
    labels = set(failing) | set(passing)
    candidates = sorted(
        (v for v in failing if failing[v]),
        key=lambda v: (-failing[v] / (failing[v] + passing[v]), -failing[v], v),
    )
    best: Explanation | None = None
    tp = fp = 0
    chosen: list[str] = []
    for label in candidates:
        tp, fp = tp + failing[label], fp + passing[label]
        chosen.append(label)
        if len(chosen) == len(labels):
            break  # every value: says nothing
        score = tp / (n_f + fp)
        if best is None or score > best.score + 1e-12:
            order = ORDER.get(dims[0]) if len(dims) == 1 else None
            shown = tuple(sorted(chosen, key=order) if order else sorted(chosen))
            best = Explanation(dims, shown, tp, n_f, fp, n_p, score)
    return best


def _rank(e: Explanation) -> tuple[float, bool, int]:
    """Best first: the higher score, then matrix dimensions before facts of the call (what a
    person sets in the matrix, at a tie), then fewer values."""
    return (-e.score, any(d in FACTS for d in e.dimensions), len(e.values))


def explain(
    cases: Sequence[Case],
    failing_ids: Iterable[str],
    geometry: Mapping[str, Any] | None = None,
    limit: int = 3,
) -> list[Explanation]:
    """The best explanations of why the cases ``failing_ids`` fail and the other ``cases``
    pass, best first (at most ``limit``); empty when nothing fails or nothing passes; one
    ``Explanation.too_few`` when fewer than ``MIN_FAILING`` fail."""
    failing_set = set(failing_ids)
    n_f = sum(1 for c in cases if c.id in failing_set)
    n_p = len(cases) - n_f
    if not n_f or not n_p:
        return []
    if n_f < MIN_FAILING:
        return [Explanation.too_few(n_f, n_p)]
    single = {d: [label(c, geometry) for c in cases] for d, label in CANDIDATES.items()}

    def best_of(dims: tuple[str, ...]) -> Explanation | None:
        labels = [" / ".join(parts) for parts in zip(*(single[d] for d in dims), strict=True)]
        if len(set(labels)) < 2:
            return None
        f: Counter[str] = Counter()
        p: Counter[str] = Counter()
        for case, label in zip(cases, labels, strict=True):
            (f if case.id in failing_set else p)[label] += 1
        return _best_set(dims, f, p, n_f, n_p)

    singles = [e for d in CANDIDATES if (e := best_of((d,))) is not None]
    singles.sort(key=_rank)
    top = singles[0].score if singles else 0.0
    pairs = [
        e
        for pair in combinations(CANDIDATES, 2)
        if (e := best_of(pair)) is not None and e.score >= top + PAIR_MARGIN
    ]
    pairs.sort(key=_rank)
    return (pairs[:1] + singles)[:limit]
