"""A comparison of two runs as one finding per case and kind: what a regression holds.

``compare_runs`` lists changes per output (error) and per timing scope; people act on cases.
A finding gathers a case's changes of one kind (a new failure, an error regression, a timing
regression) with the detail of each output inside it: its bound usage before and after (and
e_rel beside it), what was allowed, and the property checks that failed, so a case that breaks
three outputs is one row, not three. A case that newly fails is one new failure: the outputs
whose error grew without failing join it (``passed`` true) rather than raise a second row.

Only the kernel is blamed: a case the machine failed to judge (a timeout, a lost worker, a
harness error: ``compare.infrastructure``) is no finding, and a case the baseline could not
judge that fails here is a new failure (as a case the baseline lacks is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from convmatrix.compare.infrastructure import infrastructure_cause
from convmatrix.compare.runs import RunComparison
from convmatrix.core.records import CaseResult, OutputMetrics
from convmatrix.core.verdict import brief

__all__ = ["Finding", "findings", "new_failure"]

Key = tuple[str, str]  # case id, kind


@dataclass
class Finding:
    """One case's change of one kind between a baseline and a new run."""

    case_id: str
    name: str
    kind: str  # new_failure | error_regression | timing_regression
    detail: str  # one line for a terminal, a CI summary, an alert row
    outputs: list[dict[str, Any]] = field(default_factory=list)
    properties: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.case_id, self.kind)


def _number(value: float | None) -> float | None:
    """JSON-safe: NaN and infinities become None (shown as "-")."""
    return None if value is None or not math.isfinite(value) else float(value)


def _output_entry(head: OutputMetrics | None, base: OutputMetrics | None) -> dict[str, Any]:
    assert head is not None
    return {
        "output": head.output,
        "base_usage": _number(base.bound_usage) if base else None,
        "usage": _number(head.bound_usage),
        "allowed": _number(head.usage_limit),
        "base_rel": _number(base.e_rel) if base else None,
        "e_rel": _number(head.e_rel),
        "passed": head.passed,
    }


def _head_output(result: CaseResult | None, output: str) -> OutputMetrics | None:
    if result is None:
        return None
    return next((m for m in result.outputs if m.output == output), None)


def new_failure(result: CaseResult, base: CaseResult | None, note: str = "") -> Finding:
    """``result`` (bad) against ``base`` as a new failure; ``note``: what to add to its line
    (a confirmation rerun says how the failure was reproduced)."""
    was = base.outcome if base is not None else "not in the baseline"
    before = {m.output: m for m in base.outputs} if base is not None else {}
    outputs = [_output_entry(o, before.get(o.output)) for o in result.outputs if not o.passed]
    props = [{"name": p.name, "detail": p.detail} for p in result.properties if not p.passed]
    detail = f"{was} -> {result.outcome}: {note + '; ' if note else ''}{brief(result)}"
    return Finding(result.case.id, result.case.pytest_id, "new_failure", detail, outputs, props)


def _newly_failing(
    compared: RunComparison, head: Mapping[str, CaseResult], base: Mapping[str, CaseResult]
) -> list[str]:
    """The cases the kernel newly fails: the comparison's new failures the machine did not
    cause, and still failing ones the baseline could not judge."""
    ids = [c.case_id for c in compared.new_failures]
    ids += [
        c.case_id for c in compared.still_failing
        if (b := base.get(c.case_id)) is not None and infrastructure_cause(b) is not None
    ]  # fmt: skip
    return [i for i in ids if infrastructure_cause(head[i]) is None]


def findings(
    compared: RunComparison,
    head: Mapping[str, CaseResult],
    base: Mapping[str, CaseResult],
) -> dict[Key, Finding]:
    """Every case the comparison flags, one finding per case and kind (``head`` and ``base``:
    the two runs' results by case id)."""
    found: dict[Key, Finding] = {}
    for case_id in _newly_failing(compared, head, base):
        finding = new_failure(head[case_id], base.get(case_id))
        found[finding.key] = finding
    for e in compared.error_regressions:
        failure = found.get((e.case_id, "new_failure"))
        if failure is not None:  # the case newly fails: its failure row holds its outputs
            if e.output not in {o["output"] for o in failure.outputs}:
                failure.outputs.append(_output_entry(
                    _head_output(head[e.case_id], e.output), _head_output(
                        base.get(e.case_id), e.output)))  # fmt: skip
            continue
        key = (e.case_id, "error_regression")
        finding = found.setdefault(key, Finding(e.case_id, e.name, key[1], ""))
        finding.outputs.append({
            "output": e.output, "base_usage": _number(e.base_usage), "usage": _number(e.head_usage),
            "base_rel": _number(e.base_rel), "e_rel": _number(e.head_rel),
            "growth": _number(e.growth),
        })  # fmt: skip
    for t in compared.timing.regressions:
        key = (t.case_id, "timing_regression")
        finding = found.setdefault(key, Finding(t.case_id, t.name, key[1], ""))
        finding.outputs.append({
            "scope": t.scope + (f"/{t.mode}" if t.mode else ""),
            "base_median_s": _number(t.base_median_s), "median_s": _number(t.head_median_s),
            "ratio": _number(t.ratio),
        })  # fmt: skip
    for finding in found.values():
        if not finding.detail:
            finding.detail = "; ".join(_change_text(finding.kind, o) for o in finding.outputs)
    return found


def _change_text(kind: str, entry: Mapping[str, Any]) -> str:
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    if kind == "timing_regression":
        return (
            f"{entry['scope']} {shown(entry['base_median_s'])}s -> "
            f"{shown(entry['median_s'])}s (x{shown(entry['ratio'])})"
        )
    if entry.get("usage") is not None or entry.get("base_usage") is not None:
        before, after = entry.get("base_usage"), entry.get("usage")
        measure = "usage"
    else:
        before, after, measure = entry.get("base_rel"), entry.get("e_rel"), "e_rel"
    growth = f" (x{shown(entry['growth'])})" if entry.get("growth") is not None else ""
    return f"{entry['output']} {measure} {shown(before)} -> {shown(after)}{growth}"
