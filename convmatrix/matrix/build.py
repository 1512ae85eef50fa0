"""From one combination of dimension values to a ``Case``: resolve symbols, fill the fields
of the op, leave the others ``None`` (docs/spec.md §2 shapes; ``Case`` docstring for the fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from convmatrix.core.case import Case
from convmatrix.matrix.rules import case_env
from convmatrix.matrix.spec import SuiteSpec
from convmatrix.matrix.values import Value, resolve_int, resolve_packing

__all__ = ["applicable_checks", "build_case", "spec_violation"]


def build_case(
    suite: SuiteSpec,
    values: Mapping[str, Value],
    geometry: Mapping[str, int],
    *,
    expect: str | None = None,
    checks: Sequence[str] | None = None,
) -> Case:
    """The case for ``values`` (one Value per dimension of the suite)."""
    env = case_env(values, geometry)

    def number(dim: str) -> int:
        return resolve_int(values[dim].data, env)

    if "dtype" in values:
        x_dtype, w_dtype = values["dtype"].data
    else:
        x_dtype, w_dtype = values["x_dtype"].data, values["w_dtype"].data
    fields: dict[str, object] = {
        "suite": suite.name,
        "op": suite.op,
        "width": values["width"].data,
        "dim": number("dim"),
        "batch": number("batch"),
        "x_dtype": x_dtype,
        "w_dtype": w_dtype,
        "layout": values["layout"].data,
        "gap": values["gap"].data,
        "activation": values["activation"].data,
        "bias": values["bias"].data,
        "expect": expect or suite.expect,
        "timed": suite.timed,
    }
    if suite.op == "update":
        fields |= {
            "tokens": number("tokens"),
            "steps": number("steps"),
            "state_len": number("state_len"),
            "circular": values["circular"].data,
            "slots": values["slots"].data,
        }
    else:
        seqlen = number("seqlen")
        packing = values["packed"].data
        final = values["final_state"].data
        fields |= {
            "seqlen": seqlen,
            "initial_state": values["initial_state"].data,
            "final_state": final,
            # dF only exists when the final state is an output that receives a gradient.
            "dfinal": values["dfinal"].data if suite.op == "fwd_bwd" and final else None,
            "seq_lens": resolve_packing(packing, {**env, "L": seqlen}) if packing else None,
        }
        if suite.op == "fwd_bwd":
            late = values.get("grad_layout")  # a late dimension: only where declared or set
            fields["grad_layout"] = None if late is None else late.data
    case = Case(**fields)  # type: ignore[arg-type]
    wanted = suite.checks if checks is None else checks
    return Case(**{**fields, "checks": applicable_checks(case, wanted)})  # type: ignore[arg-type]


def applicable_checks(case: Case, wanted: Sequence[str]) -> tuple[str, ...]:
    """The property checks of ``wanted`` that mean something for ``case``; others drop out
    (causality on one token, packed isolation without a second sequence)."""
    live_segments = sum(1 for n in case.seq_lens or () if n > 0)
    ok = {
        "causality": (case.seqlen or case.tokens or 0) >= 2,
        "chunk_consistency": case.op == "update" or (case.seqlen or 0) >= 2,
        "packed_isolation": live_segments >= 2,
    }
    return tuple(c for c in wanted if ok.get(c, False))


def spec_violation(case: Case) -> str | None:
    """Why docs/spec.md §2 itself rejects the case (every kernel must raise), or None."""
    if case.op == "update" and case.state_len is not None and case.state_len < case.width - 1:
        return f"state_len {case.state_len} < width-1 = {case.width - 1} (docs/spec.md §2)"
    return None
