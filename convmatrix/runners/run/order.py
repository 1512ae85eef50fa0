"""The order a parallel run hands out its cases: the largest first.

Workers take cases as they free up, so a run ends when the case started last ends. In matrix
order a large case may start late and keep one worker busy while the others idle: on the
40-case ``dao-parity`` spread at ``-n 2`` (benchmarks/bench_properties.py ``spread``) one
worker's cases took 7.8 s and the other's 5.3 s, its largest case (4.3 s) among the last.
Handing the largest out first (list scheduling by longest processing time: the run ends within
4/3 of the best possible order) leaves only small cases for the end, where they even the
workers out. The xdist executor pairs it with xdist's ``worksteal`` scheduling: each worker
starts on half the ordered cases and an idle worker takes the tail of the busiest one's queue;
under ``--dist load`` the first chunks of an ordered list would give one worker all the large
cases. The Ray executor's idle actors take the next cases of the ordered queue.

Only the order changes: the cases, their ids and what is recorded of each are the same, and
``-n 0`` (one process, nothing to balance) keeps the matrix order its progress output follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from convmatrix.core.case import Case
from convmatrix.matrix.build import case_elements

__all__ = ["expected_work", "largest_first"]

T = TypeVar("T")

# A forward and backward call makes three passes of the forward's size (y, dx, the parameter
# gradients), and so do its reference and framework path: close enough to rank cases.
_PASSES = {"fwd_bwd": 3}


def expected_work(case: Case) -> int:
    """A case's work in element passes, for ranking only (not a time)."""
    return case_elements(case) * _PASSES.get(case.op, 1)


def largest_first(things: Iterable[T], case_of: Callable[[T], Case | None]) -> list[T]:
    """``things`` by the expected work of their cases, the largest first; ties (and things
    without a case, ranked last) keep their order, so every process orders alike."""
    return sorted(things, key=lambda t: -expected_work(c) if (c := case_of(t)) else 0)
