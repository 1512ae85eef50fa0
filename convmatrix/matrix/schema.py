"""The matrix file's schema: every key declared once, validated into ``MatrixSpec``.

Top level::

    name: nightly                # default: the file name
    description: ...
    seed: 0                      # strategies' seed (a suite may override)
    geometry: {tile: 64, ctile: 32, vec: 8}   # symbol defaults when a kernel declares none
    tolerances: {bfloat16: {dw: {rel: 0.3, norm: 0.05}}}
    policy: {mode: bound, safety: 2, bound: probabilistic, lambda: 6,
             factor: 2, floor: 1e-6, tau_scale: 1.0}
    timeout_s: 120               # per case
    memory_budget_mb: 8192       # peak memory one case may add (over: the case fails)
    max_cases: 100000            # refuse to expand to more (counted before expanding)
    timing: {warmup: 3, repeats: 10, budget_s: 2.0}
    cases: [5904fa0c1d2e, ...]   # keep only these case ids (what adequacy --minimize writes)
    suites:
      NAME:
        op: fwd | fwd_bwd | update
        strategy: full | pairwise | {name: twise, t: 3}
        dimensions: {width: [2, 3, 4], seqlen: [1, K-1, tile+1], ...}
        include: [{width: 4, seqlen: 2, initial_state: random}]
        exclude: [{layout: channel_first, initial_state: random}]
        constraints: [{if: {packed: {not: none}}, then: {batch: 1}}]
        checks: [causality, chunk_consistency, packed_isolation]
        expect: ok | error
        timed: false

Dimension names and values are in ``convmatrix.matrix.values.DIMENSIONS``.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from typing import TypeVar

from convmatrix.core.bounds import BOUND_MODES
from convmatrix.core.case import CHECKS, OPS
from convmatrix.core.tolerances import DEFAULT_TOLERANCES, OUTPUTS, Policy, Tolerance, Tolerances
from convmatrix.core.verdict import RULES
from convmatrix.matrix.errors import did_you_mean
from convmatrix.matrix.rules import parse_constraint, parse_exclude
from convmatrix.matrix.source import YNode
from convmatrix.matrix.spec import (
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_TIMEOUT_S,
    CaseRef,
    IncludeSpec,
    MatrixSpec,
    SuiteSpec,
    TimingSettings,
)
from convmatrix.matrix.strategies import STRATEGIES
from convmatrix.matrix.symbols import GEOMETRY_SYMBOLS
from convmatrix.matrix.values import (
    DIMENSIONS,
    LATE_DIMENSIONS,
    Dim,
    Value,
    check_int,
    dims_for,
    is_required,
)

__all__ = ["parse_matrix"]

TOP_KEYS = (
    "name",
    "description",
    "seed",
    "geometry",
    "tolerances",
    "policy",
    "timeout_s",
    "memory_budget_mb",
    "max_cases",
    "timing",
    "cases",
    "suites",
)
SUITE_KEYS = (
    "description",
    "op",
    "strategy",
    "seed",
    "dimensions",
    "include",
    "exclude",
    "constraints",
    "checks",
    "expect",
    "timed",
)
_EXPECT = ("ok", "error")
_TIMEOUT = DEFAULT_TIMEOUT_S
POLICY_RULES = tuple(RULES)  # the verdict's rules, by name
T = TypeVar("T")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_CASE_ID = re.compile(r"^[0-9a-f]{12}$")


# -- scalars -------------------------------------------------------------------------------
def _int(node: YNode, what: str, minimum: int = 0) -> int:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int):
        raise node.error(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise node.error(f"{what} must be >= {minimum}, got {value}")
    return check_int(value, node)


def _number(node: YNode, what: str, positive: bool = False) -> float:
    value = node.value
    if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise node.error(f"{what} must be a number, got {node.value!r}")
    if not math.isfinite(value):
        raise node.error(f"{what} must be a finite number, got {value}")
    if value < 0 or (positive and value == 0):
        raise node.error(f"{what} must be {'> 0' if positive else '>= 0'}, got {value}")
    return float(value)


def _str(node: YNode, what: str) -> str:
    if not isinstance(node.value, str):
        raise node.error(f"{what} must be a string, got {node.value!r}")
    return node.value


def _choice(node: YNode, what: str, choices: tuple[str, ...]) -> str:
    value = node.value
    if value not in choices:
        hint = did_you_mean(str(value), choices) or f" (choose from {', '.join(choices)})"
        raise node.error(f"unknown {what} {value!r}{hint}")
    return value


def _opt(node: YNode, key: str, parse: Callable[[YNode], T], default: T) -> T:
    """``parse(node[key])`` when the key is present (even if null), else ``default``."""
    child = node.get(key)
    return default if child is None else parse(child)


def _bool(node: YNode, what: str) -> bool:
    if not isinstance(node.value, bool):
        raise node.error(f"{what} must be true or false, got {node.value!r}")
    return node.value


# -- matrix-wide sections -------------------------------------------------------------------
def _geometry(node: YNode) -> dict[str, int]:
    node.expect_map("geometry").check_keys(GEOMETRY_SYMBOLS)
    return {key: _int(value, f"geometry {key}", 1) for key, value in node.items()}


def _tolerances(node: YNode) -> Tolerances:
    node.expect_map("tolerances")
    dtypes = sorted({dt for dt, _ in DEFAULT_TOLERANCES})
    rows: dict[tuple[str, str], Tolerance] = {}
    for dt_key, outputs in node.items():
        if dt_key not in dtypes:
            raise node.key_error(dt_key, f"unknown dtype{did_you_mean(dt_key, dtypes)}")
        outputs.expect_map(f"tolerances for {dt_key}").check_keys(OUTPUTS)
        for out, row in outputs.items():
            row.expect_map("a tolerance row").check_keys(("rel", "norm"))
            base = DEFAULT_TOLERANCES[(dt_key, out)]
            rows[(dt_key, out)] = Tolerance(
                rel=_opt(row, "rel", lambda n: _number(n, "rel"), base.rel),
                norm=_opt(row, "norm", lambda n: _number(n, "norm"), base.norm),
            )
    return Tolerances(rows)


def _policy(node: YNode) -> Policy:
    node.expect_map("policy").check_keys(
        ("rule", "mode", "factor", "floor", "tau_scale", "safety", "bound", "lambda")
    )
    base = Policy()
    # ``mode`` is the key's older name (matrices written before the glossary), still read.
    key = "mode" if node.get("mode") is not None else "rule"
    if key == "mode" and node.get("rule") is not None:
        raise node.get("mode").error(
            "give the policy's rule once: 'rule' (or its older name 'mode')"
        )
    return Policy(
        rule=_opt(node, key, lambda n: _choice(n, "policy rule", POLICY_RULES), base.rule),
        factor=_opt(node, "factor", lambda n: _number(n, "factor", True), base.factor),
        floor=_opt(node, "floor", lambda n: _number(n, "floor"), base.floor),
        tau_scale=_opt(node, "tau_scale", lambda n: _number(n, "tau_scale", True), base.tau_scale),
        safety=_opt(node, "safety", lambda n: _number(n, "safety", True), base.safety),
        bound_mode=_opt(node, "bound", lambda n: _choice(n, "bound", BOUND_MODES), base.bound_mode),
        bound_lambda=_opt(node, "lambda", lambda n: _number(n, "lambda", True), base.bound_lambda),
    )


def _timing(node: YNode | None, timed_suites: tuple[str, ...]) -> TimingSettings:
    base = TimingSettings(suites=timed_suites)
    if node is None:
        return base
    node.expect_map("timing").check_keys(("warmup", "repeats", "budget_s"))
    return TimingSettings(
        warmup=_opt(node, "warmup", lambda n: _int(n, "warmup"), base.warmup),
        repeats=_opt(node, "repeats", lambda n: _int(n, "repeats", 1), base.repeats),
        budget_s=_opt(node, "budget_s", lambda n: _number(n, "budget_s", True), base.budget_s),
        suites=timed_suites,
    )


# -- suites ---------------------------------------------------------------------------------
def _values(dim: Dim, node: YNode) -> tuple[Value, ...]:
    items = node.value if node.is_list else [node]
    if not items:
        raise node.error("empty dimension: give at least one value")
    seen: dict[str, Value] = {}
    for item in items:
        label, data = dim.parse(item)
        if label in seen:
            raise item.error(f"duplicate value {label!r} (also at line {seen[label].mark.line})")
        seen[label] = Value(dim.name, label, data, item.mark, item.path)
    return tuple(seen.values())


def _dimensions(node: YNode, op: str) -> tuple[dict[str, tuple[Value, ...]], tuple[str, ...]]:
    node.expect_map("dimensions")
    applicable = [d.name for d in dims_for(op)]
    for key in node.value:
        if key not in DIMENSIONS:
            hint = did_you_mean(key, DIMENSIONS) or f" (dimensions: {', '.join(applicable)})"
            raise node.key_error(key, f"unknown dimension{hint}")
        if key not in applicable:
            ops = ", ".join(sorted(DIMENSIONS[key].ops))
            raise node.key_error(key, f"dimension {key!r} does not apply to op {op!r} ({ops})")
    if "dtype" in node.value and ({"x_dtype", "w_dtype"} & set(node.value)):
        raise node.key_error("dtype", "'dtype' (pairs) excludes 'x_dtype'/'w_dtype': use one")
    skip = {"x_dtype", "w_dtype"} if "dtype" in node.value else {"dtype"}
    dims: dict[str, tuple[Value, ...]] = {}
    for dim in dims_for(op):
        if dim.name in skip or (dim.name in LATE_DIMENSIONS and dim.name not in node.value):
            continue
        if dim.name in node.value:
            dims[dim.name] = _values(dim, node.value[dim.name])
        elif is_required(dim):
            raise node.error(f"missing required dimension {dim.name!r} for op {op!r}")
        else:
            default = YNode(dim.default, node.mark, f"{node.path}.{dim.name}")
            dims[dim.name] = _values(dim, default)
    return dims, tuple(k for k in dims if k in node.value)


def _checks(node: YNode) -> tuple[str, ...]:
    items = node.expect_list("checks").value
    return tuple(dict.fromkeys(_choice(item, "check", CHECKS) for item in items))


def _include(node: YNode, dims: dict[str, tuple[Value, ...]], op: str) -> IncludeSpec:
    late = tuple(d.name for d in dims_for(op) if d.name in LATE_DIMENSIONS and d.name not in dims)
    node.expect_map("an include entry").check_keys((*dims, *late, "expect", "checks"))
    values: dict[str, Value] = {}
    for key, vnode in node.items():
        if key in dims or key in late:
            label, data = DIMENSIONS[key].parse(vnode)
            values[key] = Value(key, label, data, vnode.mark, vnode.path)
    expect = _opt(node, "expect", lambda n: _choice(n, "expect", _EXPECT), None)
    checks = _opt(node, "checks", _checks, None)
    return IncludeSpec(values, expect, checks, node.mark, node.path)


def _strategy(node: YNode | None) -> tuple[str, dict[str, int]]:
    if node is None:
        return "pairwise", {}
    if isinstance(node.value, str):
        return _choice(node, "strategy", tuple(STRATEGIES)), {}
    node.expect_map("strategy").check_keys(("name", "t"), required=("name",))
    name = _choice(node.value["name"], "strategy", tuple(STRATEGIES))
    params: dict[str, int] = {}
    for key, value in node.items():
        if key == "name":
            continue
        if key not in STRATEGIES[name][1]:
            raise node.key_error(key, f"strategy {name!r} takes no parameter {key!r}")
        params[key] = _int(value, key, 1)
    return name, params


def _entries(node: YNode, key: str) -> list[YNode]:
    child = node.get(key)
    return [] if child is None else child.expect_list(key).value


def _suite(name: str, node: YNode, default_seed: int) -> SuiteSpec:
    node.expect_map(f"suite {name!r}").check_keys(SUITE_KEYS, required=("op", "dimensions"))
    op = _choice(node.value["op"], "op", OPS)
    dims, declared = _dimensions(node.value["dimensions"], op)
    includes = tuple(_include(entry, dims, op) for entry in _entries(node, "include"))
    # Rules may name any value a case can take: declared ones and those only includes add.
    known: dict[str, list[str]] = {k: [v.label for v in vals] for k, vals in dims.items()}
    for inc in includes:
        for key, value in inc.values.items():
            if value.label not in known.setdefault(key, []):
                known[key].append(value.label)
    rules = [parse_exclude(e, known, i) for i, e in enumerate(_entries(node, "exclude"))]
    rules += [parse_constraint(e, known, i) for i, e in enumerate(_entries(node, "constraints"))]
    strategy, params = _strategy(node.get("strategy"))
    return SuiteSpec(
        name=name,
        op=op,
        strategy=strategy,
        strategy_params=params,
        seed=_opt(node, "seed", lambda n: _int(n, "seed"), default_seed),
        dimensions=dims,
        declared=declared,
        includes=includes,
        rules=tuple(rules),
        checks=_opt(node, "checks", _checks, ()),
        expect=_opt(node, "expect", lambda n: _choice(n, "expect", _EXPECT), "ok"),
        timed=_opt(node, "timed", lambda n: _bool(n, "timed"), False),
        description=_opt(node, "description", lambda n: _str(n, "description"), ""),
        mark=node.mark,
        path=node.path,
    )


def parse_matrix(root: YNode, *, name: str, path: str, content_hash: str) -> MatrixSpec:
    """Validate the document ``root`` into a ``MatrixSpec``; MatrixError on the first problem."""
    root.expect_map("a matrix").check_keys(TOP_KEYS, required=("suites",))
    name = _opt(root, "name", _name, name)
    seed = _opt(root, "seed", lambda n: _int(n, "seed"), 0)
    suites_node = root.value["suites"].expect_map("suites")
    if not suites_node.value:
        raise suites_node.error("no suites: a matrix needs at least one")
    suites = []
    for suite_name, suite_node in suites_node.items():
        if not _NAME.match(suite_name):
            raise suites_node.key_error(suite_name, "suite names are letters, digits, '_', '-'")
        suites.append(_suite(suite_name, suite_node, seed))
    timed = tuple(s.name for s in suites if s.timed)
    return MatrixSpec(
        name=name,
        path=path,
        content_hash=content_hash,
        description=_opt(root, "description", lambda n: _str(n, "description"), ""),
        seed=seed,
        geometry=_opt(root, "geometry", _geometry, {}),
        suites=tuple(suites),
        tolerances=_opt(root, "tolerances", _tolerances, Tolerances()),
        policy=_opt(root, "policy", _policy, Policy()),
        timeout_s=_opt(root, "timeout_s", lambda n: _number(n, "timeout_s", True), _TIMEOUT),
        memory_budget_mb=_opt(
            root,
            "memory_budget_mb",
            lambda n: _number(n, "memory_budget_mb", True),
            DEFAULT_MEMORY_BUDGET_MB,
        ),
        timing=_timing(root.get("timing"), timed),
        mark=root.mark,
        cases=_opt(root, "cases", _case_refs, ()),
        max_cases=_opt(root, "max_cases", _max_cases, None),
    )


def _max_cases(node: YNode) -> int:
    return _int(node, "max_cases", minimum=1)


def _case_refs(node: YNode) -> tuple[CaseRef, ...]:
    """``cases: [id, ...]``: 12-hex-digit case ids, each once."""
    refs: dict[str, CaseRef] = {}
    for item in node.expect_list("cases").value:
        text = str(item.value)
        if not _CASE_ID.match(text):
            raise item.error(f"a case id is 12 lowercase hex digits, got {item.value!r}")
        if text in refs:
            raise item.error(f"case id {text} listed twice (also at line {refs[text].mark.line})")
        refs[text] = CaseRef(text, item.mark, item.path)
    if not refs:
        raise node.error("cases: list at least one case id, or drop the key")
    return tuple(refs.values())


def _name(node: YNode) -> str:
    name = _str(node, "name")
    if not _NAME.match(name):
        raise node.error(f"name {name!r} must be letters, digits, '_', '-', '.'")
    return name
