"""Which combinations of dimension values make a case: exclude entries, constraints, and the
rules every case obeys by construction (positive sizes, packings that fit, ...).

A rule reads a few dimensions and says why a combination is invalid, or None. Because rules
name the dimensions they read, the covering-array generator can check them on partial
combinations and only tries to cover pairs that some valid case can contain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from convmatrix.matrix.errors import did_you_mean
from convmatrix.matrix.source import YNode
from convmatrix.matrix.symbols import Expr
from convmatrix.matrix.values import DIMENSIONS, Value, resolve_int, resolve_packing

__all__ = ["Matcher", "Rule", "intrinsic_rules", "parse_constraint", "parse_exclude"]

Assignment = Mapping[str, Value]


@dataclass(frozen=True)
class Rule:
    """``check`` returns why ``values`` (holding at least ``dims``) is invalid, or None."""

    dims: tuple[str, ...]
    check: Callable[[Assignment], str | None]
    where: str  # e.g. "exclude[2] (line 40)", for messages


@dataclass(frozen=True)
class Matcher:
    """One ``dim: value | [values] | {not: value(s)}`` condition, compared by label."""

    dim: str
    labels: tuple[str, ...]
    negate: bool = False

    def matches(self, value: Value) -> bool:
        return (value.label in self.labels) != self.negate

    def __str__(self) -> str:
        op = "not in" if self.negate else "in"
        return f"{self.dim} {op} [{', '.join(self.labels)}]"


def parse_matchers(node: YNode, known: Mapping[str, Sequence[str]], what: str) -> list[Matcher]:
    """Parse ``{dim: condition}``; each value must be one the suite can produce."""
    node.expect_map(what)
    if not node.value:
        raise node.error(f"{what} must name at least one dimension")
    matchers = []
    for dim, cond in node.items():
        if dim not in known:
            raise node.key_error(dim, f"unknown dimension{did_you_mean(dim, known)}")
        negate = cond.is_map and list(cond.value) == ["not"]
        target = cond.value["not"] if negate else cond
        items = target.value if target.is_list else [target]
        labels = []
        for item in items:
            label = DIMENSIONS[dim].parse(item)[0]
            if label not in known[dim]:
                hint = did_you_mean(label, known[dim]) or f" (values: {', '.join(known[dim])})"
                raise item.error(f"{label!r} is not a value of dimension {dim!r}{hint}")
            labels.append(label)
        matchers.append(Matcher(dim, tuple(labels), negate))
    return matchers


def _all_match(matchers: Sequence[Matcher], values: Assignment) -> bool:
    return all(m.matches(values[m.dim]) for m in matchers)


def parse_exclude(node: YNode, known: Mapping[str, Sequence[str]], index: int) -> Rule:
    matchers = parse_matchers(node, known, "an exclude entry")
    where = f"exclude[{index}] (line {node.mark.line})"

    def check(values: Assignment) -> str | None:
        return f"excluded by {where}" if _all_match(matchers, values) else None

    return Rule(tuple(m.dim for m in matchers), check, where)


def parse_constraint(node: YNode, known: Mapping[str, Sequence[str]], index: int) -> Rule:
    """``{if: {dim: cond}, then: {dim: cond}}``: whenever ``if`` matches, ``then`` must."""
    node.expect_map("a constraint")
    node.check_keys(("if", "then"), required=("if", "then"))
    when = parse_matchers(node.value["if"], known, "'if'")
    then = parse_matchers(node.value["then"], known, "'then'")
    where = f"constraints[{index}] (line {node.mark.line})"
    text = f"if {' and '.join(map(str, when))} then {' and '.join(map(str, then))}"

    def check(values: Assignment) -> str | None:
        if _all_match(when, values) and not _all_match(then, values):
            return f"violates {where}: {text}"
        return None

    dims = tuple(dict.fromkeys(m.dim for m in (*when, *then)))
    return Rule(dims, check, where)


# -- rules every case obeys -------------------------------------------------------------
def case_env(values: Assignment, geometry: Mapping[str, int]) -> dict[str, int]:
    """Symbols for one case: K from its width plus the kernel/matrix geometry."""
    return {**geometry, "K": values["width"].data}


def _positive(dim: str, minimum: int, geometry: Mapping[str, int]) -> Rule:
    def check(values: Assignment) -> str | None:
        env = case_env(values, geometry)
        value = values[dim]
        where = (
            f" at K={env['K']}" if isinstance(value.data, Expr) and "K" in value.data.names else ""
        )
        try:
            number = resolve_int(value.data, env)
        except ZeroDivisionError:
            return f"{dim}={value.label} divides by zero{where}"
        if number < minimum:
            return f"{dim}={value.label} is {number}{where} (must be >= {minimum})"
        return None

    return Rule((dim, "width"), check, f"{dim} >= {minimum}")


def _dfinal(values: Assignment) -> str | None:
    if values["dfinal"].data == "random" and not values["final_state"].data:
        return "dfinal=random needs final_state=true"
    return None


def _packing_fits(geometry: Mapping[str, int]) -> Callable[[Assignment], str | None]:
    def check(values: Assignment) -> str | None:
        packing = values["packed"].data
        if packing is None:
            return None
        env = case_env(values, geometry)
        try:
            env["L"] = resolve_int(values["seqlen"].data, env)
            resolve_packing(packing, env)
        except (ValueError, ZeroDivisionError) as exc:
            return f"packed={values['packed'].label}: {exc}"
        return None

    return check


def _slot_padding(geometry: Mapping[str, int]) -> Callable[[Assignment], str | None]:
    def check(values: Assignment) -> str | None:
        if values["slots"].data != "permuted_pad":
            return None
        if resolve_int(values["batch"].data, case_env(values, geometry)) < 2:
            return "slots=permuted_pad needs batch >= 2 (a live row besides the pad row)"
        return None

    return check


def intrinsic_rules(dims: Sequence[str], geometry: Mapping[str, int]) -> list[Rule]:
    """Rules that make a combination meaningful at all, for the dimensions of one suite."""
    rules = [
        _positive(d, 1, geometry)
        for d in ("seqlen", "dim", "batch", "tokens", "steps")
        if d in dims
    ]
    if "state_len" in dims:
        # S < K-1 is meaningful: it is outside the contract and becomes an expected error.
        rules.append(_positive("state_len", 0, geometry))
    if "dfinal" in dims:
        rules.append(Rule(("dfinal", "final_state"), _dfinal, "dfinal needs final_state"))
    if "packed" in dims:
        rules.append(Rule(("packed", "seqlen", "width"), _packing_fits(geometry), "packing fits"))
    if "slots" in dims:
        rules.append(Rule(("slots", "batch", "width"), _slot_padding(geometry), "pad slot"))
    return rules
