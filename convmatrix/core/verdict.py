"""The one verdict builder: per-output pass/fail and the text that explains a failure.

``judge_output`` applies the ``Policy`` to measured metrics: by default the bound usage of the
bound model (docs/spec.md §4) against the policy's safety factor, else a tolerance row
(``Tolerances.lookup(judged_dtype(output, case), output)``); ``describe`` turns a
``CaseResult`` into lines naming every failing output with its greatest abs and rel
difference, where it is, and what was allowed.
The pytest item, the ``convmatrix run`` summary and the reports all print through here.

``judged_dtype`` is the one rule of which dtype an output is stored and judged in; the diff's
noise level, the report's colouring and ``history`` use it too.

Policy modes are rules chosen from a mapping: ``bound`` (the default: bound usage <= safety,
falling back to the threshold where no bound was computed), ``threshold`` (the table's rel/norm
limits),
``framework`` (flash-attention's rule: e <= factor x the torch path's e + floor) and
``threshold_or_framework`` (either). A non-finite error never passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from convmatrix.core.case import Case
from convmatrix.core.records import BAD_OUTCOMES, CaseResult, ErrorMetrics, OutputMetrics
from convmatrix.core.tolerances import PARAM_GRADS, Policy, Tolerance, Tolerances

__all__ = [
    "RULES",
    "brief",
    "broken_zeros_text",
    "case_severity",
    "describe",
    "judge_output",
    "judged_dtype",
    "limit_usage",
    "outcome_of",
    "output_brief",
    "output_severity",
    "tolerance_for",
    "worst",
]


def judged_dtype(output: str, case: Case) -> str:
    """The dtype ``output`` is stored and judged in: dw/db the weight dtype (bias is stored
    like the weight); y, dx, F and a decode state the x dtype; dS the initial state's dtype,
    which the harness stores in the x dtype. dw of x=bf16 with fp32 weights is an fp32 result
    of exact bf16 products, judged as fp32; with x=fp32, w=bf16 it is judged as bf16."""
    if output in PARAM_GRADS:
        return case.w_dtype
    return case.x_dtype  # y, F, dx, state; dS: the state dtype, which is x's


def tolerance_for(tolerances: Tolerances, case: Case, output: str) -> Tolerance:
    return tolerances.lookup(judged_dtype(output, case), output)


# A rule gives the (rel, norm) limits it allows, or None when it cannot judge (no torch path).
Rule = Callable[[Tolerance, Policy, ErrorMetrics | None], tuple[float, float] | None]


def _threshold(tol: Tolerance, policy: Policy, fw: ErrorMetrics | None) -> tuple[float, float]:
    return tol.rel, tol.norm


def _framework(
    tol: Tolerance, policy: Policy, fw: ErrorMetrics | None
) -> tuple[float, float] | None:
    if fw is None or not (math.isfinite(fw.e_rel) and math.isfinite(fw.e_norm)):
        return None
    return policy.factor * fw.e_rel + policy.floor, policy.factor * fw.e_norm + policy.floor


RULES: dict[str, tuple[Rule, ...]] = {
    "bound": (_threshold,),  # the bound usage judges; the threshold only where no bound exists
    "threshold": (_threshold,),
    "framework": (_framework, _threshold),  # threshold only when the torch path is missing
    "threshold_or_framework": (_threshold, _framework),
}


def judge_output(
    output: str,
    m: ErrorMetrics,
    fw: ErrorMetrics | None,
    tol: Tolerance,
    policy: Policy,
    *,
    exact: bool = False,
    bound_usage: float | None = None,
    broken_zeros: int | None = None,
) -> OutputMetrics:
    """The recorded metrics of one output with its limits and verdict.

    ``exact`` outputs (a decode state: copies of inputs) must match bit for bit (e_abs == 0).
    Under the ``bound`` policy ``bound_usage`` decides (<= ``policy.safety``), and no element
    whose bound is zero may come out non-zero (``broken_zeros``, counted apart from the
    usage: docs/spec.md §4); the rows' limits are still recorded, with their usage, for the
    other policies' view.
    """
    try:
        rules = RULES[policy.rule]
    except KeyError:
        raise ValueError(f"unknown policy rule {policy.rule!r}: one of {sorted(RULES)}") from None
    limits = [lim for rule in rules if (lim := rule(tol, policy, fw)) is not None]
    if policy.rule == "framework":
        limits = limits[:1]  # the framework rule alone, or the threshold when it cannot judge
    finite = math.isfinite(m.e_abs)
    passing = [lim for lim in limits if m.e_rel <= lim[0] and m.e_norm <= lim[1]]
    chosen = passing[0] if passing else limits[0]
    passed = finite and bool(passing) and (not exact or m.e_abs == 0.0)
    by_bound = policy.rule == "bound" and bound_usage is not None and not exact
    if by_bound:
        assert bound_usage is not None
        passed = finite and bound_usage <= policy.safety and not broken_zeros
    return OutputMetrics(
        output=output,
        e_abs=m.e_abs,
        e_rel=m.e_rel,
        e_norm=m.e_norm,
        tau=m.tau,
        scale=m.scale,
        worst_index=m.worst_index,
        fw_abs=None if fw is None else fw.e_abs,
        fw_rel=None if fw is None else fw.e_rel,
        fw_norm=None if fw is None else fw.e_norm,
        limit_rel=0.0 if exact else chosen[0],
        limit_norm=0.0 if exact else chosen[1],
        passed=passed,
        bound_usage=bound_usage,
        limit_usage=None if exact else limit_usage(m, tol),
        usage_limit=policy.safety if by_bound else None,
        broken_zeros=broken_zeros,
    )


def limit_usage(m: ErrorMetrics, tol: Tolerance) -> float | None:
    """How much of the threshold row an output uses: max(e_rel/rel, e_norm/norm)."""
    return worst(e / lim for e, lim in ((m.e_rel, tol.rel), (m.e_norm, tol.norm)) if lim > 0)


def outcome_of(result: CaseResult) -> str:
    """passed/failed from the judged outputs and property checks of a completed case."""
    ok = all(o.passed for o in result.outputs) and all(p.passed for p in result.properties)
    return "passed" if ok else "failed"


def broken_zeros_text(n: int) -> str:
    """The verdict's words for elements whose bound is zero that came out non-zero."""
    return f"{n} element{'s' if n != 1 else ''} expected exactly 0 came out non-zero"


def _output_line(o: OutputMetrics) -> str:
    where = "" if o.worst_index is None else f" at {o.worst_index}"
    if o.usage_limit is not None and o.bound_usage is not None:
        zeros = f"{broken_zeros_text(o.broken_zeros)}; " if o.broken_zeros else ""
        rest = " of the others" if o.broken_zeros else ""
        return (
            f"{o.output}: {zeros}bound usage{rest} {o.bound_usage:.3g} "
            f"(allowed {o.usage_limit:.3g}), "
            f"max|a-r| {o.e_abs:.3g}{where}; e_rel {o.e_rel:.3g}, e_norm {o.e_norm:.3g}"
            + ("" if o.fw_rel is None else f"; torch path e_rel {o.fw_rel:.3g}")
        )
    line = (
        f"{o.output}: e_rel {o.e_rel:.3g} (allowed {o.limit_rel:.3g}), "
        f"e_norm {o.e_norm:.3g} (allowed {o.limit_norm:.3g}), "
        f"max|a-r| {o.e_abs:.3g}{where}; tau {o.tau:.3g} (rms of reference {o.scale:.3g})"
    )
    if o.fw_rel is not None:
        line += f"; torch path e_rel {o.fw_rel:.3g}, e_norm {o.fw_norm:.3g}"
    return line


def output_brief(o: OutputMetrics) -> str:
    """One output's verdict in a few words: ``dx usage 151 (allowed 2)`` or, judged by the
    rows, ``dx e_rel 0.3 (allowed 0.001)``."""
    if o.usage_limit is not None and o.bound_usage is not None:
        return f"{o.output} usage {o.bound_usage:.3g} (allowed {o.usage_limit:.3g})"
    if o.limit_rel is not None:
        return f"{o.output} e_rel {o.e_rel:.3g} (allowed {o.limit_rel:.3g})"
    return f"{o.output} e_rel {o.e_rel:.3g}"


def brief(result: CaseResult, limit: int = 300) -> str:
    """A result's failure in one line: its failing outputs and properties, else its message
    (what CLI lines, the job summary, JUnit's ``message`` and alert rows show)."""
    parts = [output_brief(o) for o in result.outputs if not o.passed]
    parts += [f"{p.name} failed" for p in result.properties if not p.passed]
    if not parts and result.message:
        parts = [result.message.strip().splitlines()[0] if result.message.strip() else ""]
    text = "; ".join(p for p in parts if p) or result.outcome
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(result: CaseResult) -> list[str]:
    """Lines explaining a result: the headline, then each failing output and property."""
    case = result.case
    head = f"{result.outcome.upper()} {case.pytest_id} [{case.id}]"
    lines = [head + (f": {result.message}" if result.message else "")]
    lines += ["  " + _output_line(o) for o in result.outputs if not o.passed]
    lines += [f"  {p.name}: {p.detail}" for p in result.properties if not p.passed]
    return lines


def worst(values: Iterable[float | None]) -> float | None:
    """The largest value, NaN counting as worst of all (a NaN output is the worst outcome)."""
    best: float | None = None
    for v in values:
        if v is None:
            continue
        if math.isnan(v):
            return math.nan
        if best is None or v > best:
            best = v
    return best


def output_severity(m: OutputMetrics) -> float | None:
    """How far an output is from what its verdict allowed: bound usage / safety when the
    bound judged it (infinite when an element expected exactly 0 came out non-zero: no ratio
    measures that), else max(e_rel/limit_rel, e_norm/limit_norm).

    Above 1 fails; comparable across dtypes and outputs, unlike raw errors. None when the
    output has no positive limit (an exact output: there is no ratio to give).
    """
    if m.usage_limit and m.bound_usage is not None:
        if m.broken_zeros:
            return math.inf
        return m.bound_usage / m.usage_limit
    return worst(
        e / lim
        for e, lim in ((m.e_rel, m.limit_rel), (m.e_norm, m.limit_norm))
        if lim is not None and lim > 0
    )


def case_severity(result: CaseResult) -> float:
    """The ordering key of "worst failures", in the terminal and in the report alike: the
    severity of the worst failing output. Crashes, timeouts, harness errors and failures
    without a numeric excess rank first (inf); passed and skipped cases are 0."""
    if result.outcome not in BAD_OUTCOMES:
        return 0.0
    value = worst(output_severity(o) for o in result.outputs if not o.passed)
    if value is None or math.isnan(value):
        return math.inf
    return value
