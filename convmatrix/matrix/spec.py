"""A loaded matrix: frozen, validated records. Nothing downstream reads the YAML again.

``convmatrix.matrix.expand.expand_matrix(spec, kernel)`` turns it into cases for one kernel
(symbols resolve against that kernel's geometry).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from convmatrix.core.tolerances import Policy, Tolerances
from convmatrix.matrix.errors import Mark
from convmatrix.matrix.rules import Rule
from convmatrix.matrix.values import Value

__all__ = ["IncludeSpec", "MatrixSpec", "SuiteSpec", "TimingSettings"]

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_BUDGET_MB = 8192.0  # what one case may add at its peak (memory_budget_mb)
# The most cases a matrix may expand to unless its ``max_cases:`` or ``--max-cases`` says
# otherwise: checked from the suites' sizes before anything is expanded (a full matrix of
# 1.7 million cases took 116 s and 1 GB to expand before running nothing).
DEFAULT_MAX_CASES = 100_000


@dataclass(frozen=True)
class TimingSettings:
    """How timed cases (``Case.timed``, set by a suite's ``timed: true``) are measured.

    ``warmup`` calls are discarded (the first is reported apart: compile/allocation),
    ``repeats`` timed calls follow, and a case stops repeating once ``budget_s`` is spent.
    """

    warmup: int = 3
    repeats: int = 10
    budget_s: float = 2.0
    suites: tuple[str, ...] = ()  # suites whose cases are timed


@dataclass(frozen=True)
class IncludeSpec:
    """One ``include`` entry: an extra case; dimensions it omits take their first value."""

    values: Mapping[str, Value]
    expect: str | None
    checks: tuple[str, ...] | None
    mark: Mark
    path: str


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    op: str
    strategy: str
    strategy_params: Mapping[str, int]
    seed: int
    # Every dimension of the op, in canonical order; undeclared ones hold their default.
    dimensions: Mapping[str, tuple[Value, ...]]
    declared: tuple[str, ...]  # the dimensions written in the file
    includes: tuple[IncludeSpec, ...]
    rules: tuple[Rule, ...]  # exclude entries and constraints
    checks: tuple[str, ...]
    expect: str
    timed: bool
    description: str
    mark: Mark
    path: str

    @property
    def cartesian_size(self) -> int:
        """Size of the plain cartesian product, before rules (what ``full`` would start from)."""
        size = 1
        for values in self.dimensions.values():
            size *= len(values)
        return size

    @property
    def case_bound(self) -> int:
        """The most cases this suite can expand to, from its dimensions' sizes alone (no
        combination drawn): ``full`` at most the cartesian product; ``twise`` (``pairwise``:
        t=2) at most one row per t-tuple of values it covers, and never more than the
        product; plus the ``include`` entries. Rules only remove cases."""
        product = self.cartesian_size
        if self.strategy in ("twise", "pairwise"):
            t = 2 if self.strategy == "pairwise" else int(self.strategy_params.get("t", 2))
            product = min(product, _tuples(tuple(len(v) for v in self.dimensions.values()), t))
        return product + len(self.includes)

    def describe_strategy(self) -> str:
        if self.strategy == "twise":
            return f"twise(t={self.strategy_params.get('t', 2)})"
        return self.strategy


def _tuples(sizes: tuple[int, ...], t: int) -> int:
    """How many t-tuples of values (one value from each of t distinct dimensions) there are:
    the elementary symmetric polynomial e_t of the sizes (t >= the dimension count: their
    product)."""
    t = min(t, len(sizes))
    e = [1] + [0] * t
    for size in sizes:
        for k in range(t, 0, -1):
            e[k] += e[k - 1] * size
    return e[t]


@dataclass(frozen=True)
class CaseRef:
    """One entry of the top-level ``cases:`` list: a case id the matrix keeps, and where."""

    id: str
    mark: Mark
    path: str


@dataclass(frozen=True)
class MatrixSpec:
    name: str
    path: str
    content_hash: str  # sha256 of the file bytes
    description: str
    seed: int
    geometry: Mapping[str, int]  # defaults for symbols the kernel does not declare
    suites: tuple[SuiteSpec, ...]
    tolerances: Tolerances
    policy: Policy
    timeout_s: float
    timing: TimingSettings
    mark: Mark
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB
    # ``cases: [id, ...]``: keep only these cases of the expansion (empty: all of them).
    cases: tuple[CaseRef, ...] = ()
    # ``max_cases: N``: the most cases the matrix may expand to (None: DEFAULT_MAX_CASES).
    max_cases: int | None = None

    @property
    def case_bound(self) -> int:
        """The most cases the matrix can expand to, before expanding it (``SuiteSpec``)."""
        return sum(suite.case_bound for suite in self.suites)

    def suite(self, name: str) -> SuiteSpec:
        for suite in self.suites:
            if suite.name == name:
                return suite
        raise KeyError(name)
