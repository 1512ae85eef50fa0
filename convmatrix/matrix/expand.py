"""Expansion: a ``MatrixSpec`` and a kernel in, the ordered list of cases out.

Per suite: resolve which symbols exist (kernel geometry over the matrix's ``geometry:``
defaults, K from each case), let the suite's strategy pick combinations under the rules, add
the ``include`` entries, build cases, then classify expected errors: cases docs/spec.md §2 rejects
and cases the kernel's declared contract rejects become ``expect="error"`` with a reason and
keep the id of the plain case, so one case matches itself across kernels and commits.
Cases needing features the kernel lacks stay as they are; runners skip them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.core.case import Case
from convmatrix.core.contract import DeclaredKernel
from convmatrix.core.tolerances import Policy, Tolerances
from convmatrix.matrix.build import build_case, spec_violation
from convmatrix.matrix.errors import MatrixError
from convmatrix.matrix.rules import Rule, intrinsic_rules
from convmatrix.matrix.spec import (
    DEFAULT_MAX_CASES,
    IncludeSpec,
    MatrixSpec,
    SuiteSpec,
    TimingSettings,
)
from convmatrix.matrix.strategies import Constraint, SearchBudgetExceeded, Space, make_strategy
from convmatrix.matrix.symbols import SYMBOL_HELP, Expr
from convmatrix.matrix.values import Packing, Value

__all__ = ["Expansion", "SuiteExpansion", "check_case_count", "expand_matrix"]


@dataclass
class SuiteExpansion:
    """One suite's combinations, kept for coverage reports."""

    suite: SuiteSpec
    strategy: str
    dims: tuple[str, ...]
    space: Space
    rows: list[tuple[int, ...]]  # generated, as value indices into suite.dimensions
    include_rows: list[dict[str, Value]]
    cases: list[Case]
    # Values/includes this kernel's geometry makes impossible (valid under the matrix's own).
    dropped: list[str] = field(default_factory=list)


@dataclass
class Expansion:
    matrix: MatrixSpec
    cases: list[Case]
    tolerances: Tolerances
    policy: Policy
    timeout_s: float
    timing: TimingSettings
    counts: dict[str, int]  # cases per suite
    strategy: dict[str, str]  # strategy per suite, e.g. "pairwise"
    geometry: dict[str, int] = field(default_factory=dict)  # symbols used for this kernel
    kernel: str | None = None
    memory_budget_mb: float = 8192.0
    suites: list[SuiteExpansion] = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list)  # values dropped for this kernel's geometry

    def by_id(self) -> dict[str, Case]:
        return {case.id: case for case in self.cases}


def _exprs(data: object) -> list[Expr]:
    if isinstance(data, Expr):
        return [data]
    if isinstance(data, Packing):
        return [e for v in (*(data.lengths or ()), *data.at, data.pad) for e in _exprs(v)]
    return []


def _check_symbols(values: Sequence[Value], geometry: Mapping[str, int], source: str) -> None:
    known = {"K", "L", *geometry}
    for value in values:
        for expr in _exprs(value.data):
            for name in expr.names:
                if name not in known:
                    raise MatrixError(
                        value.mark,
                        value.path,
                        f"cannot resolve {expr.text!r}: {source} declares no {name!r} "
                        f"({SYMBOL_HELP[name]}); add it to the matrix's 'geometry:' defaults "
                        "or use a kernel that declares it",
                    )


def _space(suite: SuiteSpec, rules: Sequence[Rule]) -> Space:
    dims = list(suite.dimensions)
    columns = [suite.dimensions[d] for d in dims]

    def wrap(rule: Rule) -> Constraint:
        idx = tuple(dims.index(d) for d in rule.dims)

        def check(values: tuple[int, ...]) -> str | None:
            picked = {dims[i]: columns[i][v] for i, v in zip(idx, values, strict=True)}
            return rule.check(picked)

        return Constraint(idx, check)

    return Space([len(c) for c in columns], [wrap(r) for r in rules])


@dataclass
class _Draw:
    """The combinations of one suite under one geometry, and what went wrong drawing them."""

    space: Space
    rows: list[tuple[int, ...]]
    includes: list[tuple[IncludeSpec, dict[str, Value]]]  # the valid include entries
    problems: list[MatrixError]


def _draw(suite: SuiteSpec, geometry: Mapping[str, int]) -> _Draw:
    rules = [*intrinsic_rules(tuple(suite.dimensions), geometry), *suite.rules]
    space = _space(suite, rules)
    strategy = make_strategy(suite.strategy, suite.strategy_params)
    try:
        rows = strategy.generate(space, suite.seed)
    except SearchBudgetExceeded as exc:
        raise MatrixError(
            suite.mark, suite.path, f"rules too intricate to satisfy: {exc}"
        ) from None
    problems: list[MatrixError] = []
    if not rows and not suite.includes:
        why = space.last_reason or "every combination is invalid"
        problems.append(MatrixError(suite.mark, suite.path, f"the suite expands to no case: {why}"))
    else:
        problems += _unused_values(suite, space, rows)
    includes = []
    for inc in suite.includes:
        values = {d: inc.values.get(d, vals[0]) for d, vals in suite.dimensions.items()}
        values |= {d: v for d, v in inc.values.items() if d not in values}  # late dimensions
        broken = next((r for r in rules if r.check(values) is not None), None)
        if broken is None:
            includes.append((inc, values))
            continue
        reason = broken.check(values)
        what = "contradicts the rules" if broken in suite.rules else "is not a valid case"
        problems.append(MatrixError(inc.mark, inc.path, f"include entry {what}: {reason}"))
    return _Draw(space, rows, includes, problems)


def _unused_values(
    suite: SuiteSpec, space: Space, rows: list[tuple[int, ...]]
) -> list[MatrixError]:
    """Every declared value must occur in some case, else the rules contradict the dimension."""
    dims = list(suite.dimensions)
    problems = []
    for dim in suite.declared:
        i = dims.index(dim)
        used = {row[i] for row in rows}
        for v, value in enumerate(suite.dimensions[dim]):
            if v in used:
                continue
            partial: list[int | None] = [None] * len(dims)
            partial[i] = v
            space.last_reason = None
            why = space.violation(partial) or (
                None if space.complete(partial) is not None else space.last_reason
            )
            why = (why or "the strategy never needed it").removeprefix(f"{dim}={value.label}: ")
            message = f"no valid case has {dim}={value.label}: {why}"
            problems.append(MatrixError(value.mark, value.path, message))
    return problems


def _fatal(
    suite: SuiteSpec, draw: _Draw, geometry: Mapping[str, int], own: Mapping[str, int]
) -> list[MatrixError]:
    """The problems that are the matrix's fault.

    A matrix must be consistent under its own ``geometry:`` defaults. A kernel declaring
    another geometry may make some values impossible (``vec-1`` is 0 when vec=1): those are
    dropped for that kernel and reported, not fatal, so one nightly matrix serves every kernel.
    """
    if not draw.problems or dict(geometry) == dict(own):
        return draw.problems
    try:
        _check_symbols(_all_values(suite), own, "the matrix")
    except MatrixError:
        return []  # only kernels give these symbols meaning: nothing to hold the matrix to
    own_problems = {e.path for e in _draw(suite, own).problems}
    return [e for e in draw.problems if e.path in own_problems]


def _all_values(suite: SuiteSpec) -> list[Value]:
    declared = [v for vals in suite.dimensions.values() for v in vals]
    return declared + [v for inc in suite.includes for v in inc.values.values()]


def _expand_suite(
    suite: SuiteSpec,
    geometry: Mapping[str, int],
    own: Mapping[str, int],
    kernel: DeclaredKernel | None,
    source: str,
) -> SuiteExpansion:
    dims = tuple(suite.dimensions)
    _check_symbols(_all_values(suite), geometry, source)
    draw = _draw(suite, geometry)
    fatal = _fatal(suite, draw, geometry, own)
    if fatal:
        raise fatal[0]
    dropped = [f"{e.path}: {e.message}" for e in draw.problems]
    cases: list[Case] = []
    for row in draw.rows:
        values = {d: suite.dimensions[d][i] for d, i in zip(dims, row, strict=True)}
        cases.append(build_case(suite, values, geometry))
    for inc, values in draw.includes:
        cases.append(build_case(suite, values, geometry, expect=inc.expect, checks=inc.checks))
    cases = list({c.id: _classify(c, kernel) for c in cases}.values())
    return SuiteExpansion(
        suite,
        suite.describe_strategy(),
        dims,
        draw.space,
        draw.rows,
        [values for _, values in draw.includes],
        cases,
        dropped,
    )


def _classify(case: Case, kernel: DeclaredKernel | None) -> Case:
    if case.expect != "ok":
        return case
    reason = spec_violation(case)
    if reason is None and kernel is not None:
        reason = kernel.contract_violation(case)
    if reason is None:
        return case
    return dataclasses.replace(case, expect="error", expect_reason=reason, id=case.id)


def _keep_listed(spec: MatrixSpec, suites: list[SuiteExpansion], source: str) -> None:
    """Apply the top-level ``cases:`` list: keep those cases (in expansion order), each of
    which must be a case of the matrix."""
    wanted = {ref.id for ref in spec.cases}
    found = {case.id for s in suites for case in s.cases}
    for ref in spec.cases:
        if ref.id not in found:
            raise MatrixError(
                ref.mark, ref.path, f"case {ref.id} is not a case of this matrix for {source}"
            )
    for s in suites:
        s.cases = [case for case in s.cases if case.id in wanted]


def check_case_count(spec: MatrixSpec, max_cases: int | None = None) -> int:
    """The most cases ``spec`` can expand to (``MatrixSpec.case_bound``, from the suites'
    sizes: nothing is expanded); a ``MatrixError`` naming the count and each suite's share
    when it is over the limit: ``max_cases`` (``--max-cases``), else the matrix's own
    ``max_cases:``, else ``DEFAULT_MAX_CASES``."""
    limit = max_cases or spec.max_cases or DEFAULT_MAX_CASES
    bound = spec.case_bound
    if bound <= limit:
        return bound
    shares = sorted(spec.suites, key=lambda s: -s.case_bound)
    biggest = ", ".join(f"{s.name}: {s.case_bound:,} ({s.describe_strategy()})" for s in shares[:3])
    raise MatrixError(
        spec.mark,
        "max_cases",
        f"the matrix can expand to {bound:,} cases ({biggest}), over the limit of {limit:,}: "
        "narrow its dimensions, use strategy pairwise, or raise the limit with 'max_cases:' "
        "in the matrix or --max-cases N",
    )


def expand_matrix(
    spec: MatrixSpec,
    kernel: DeclaredKernel | None = None,
    max_cases: int | None = None,
    *,
    keep: Callable[[Case], bool] | None = None,
    enough: Callable[[list[Case]], bool] | None = None,
) -> Expansion:
    """All cases of ``spec`` for ``kernel`` (None: symbols from the matrix's ``geometry:``
    only), suites in file order, deterministic. A matrix of more than ``max_cases`` (else its
    own ``max_cases:``, else ``DEFAULT_MAX_CASES``) possible cases is refused before anything
    is expanded (``check_case_count``).

    ``keep``: only the cases it accepts (a run's ``--case``); ``enough``: no further suite is
    expanded once it says the cases kept so far are all there is to find (a case's id is a
    hash of its parameters, so finding it means building the cases before it; a top-level
    ``cases:`` list, checked against every suite, expands them all)."""
    check_case_count(spec, max_cases)
    declared = kernel.capabilities.geometry.symbols() if kernel is not None else {}
    geometry = {**spec.geometry, **declared}
    source = f"kernel {kernel.name!r}" if kernel is not None else "no kernel given and the matrix"
    suites: list[SuiteExpansion] = []
    for suite in spec.suites:
        suites.append(_expand_suite(suite, geometry, spec.geometry, kernel, source))
        if keep is not None and not spec.cases:
            suites[-1].cases = [c for c in suites[-1].cases if keep(c)]
            if enough is not None and enough([c for s in suites for c in s.cases]):
                break
    if spec.cases:
        _keep_listed(spec, suites, source)
        if keep is not None:
            for s in suites:
                s.cases = [c for c in s.cases if keep(c)]
    return Expansion(
        matrix=spec,
        cases=[c for s in suites for c in s.cases],
        tolerances=spec.tolerances,
        policy=spec.policy,
        timeout_s=spec.timeout_s,
        timing=spec.timing,
        counts={s.suite.name: len(s.cases) for s in suites},
        strategy={s.suite.name: s.strategy for s in suites},
        geometry=dict(geometry),
        kernel=kernel.name if kernel is not None else None,
        memory_budget_mb=spec.memory_budget_mb,
        suites=suites,
        notes=[note for s in suites for note in s.dropped],
    )
