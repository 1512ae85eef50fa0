"""From one combination of dimension values to a ``Case``: resolve symbols, fill the fields
of the op, leave the others ``None`` (docs/spec.md §2 shapes; ``Case`` docstring for the fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from convmatrix.core.case import Case
from convmatrix.matrix.errors import MatrixError
from convmatrix.matrix.rules import case_env
from convmatrix.matrix.spec import SuiteSpec
from convmatrix.matrix.values import Value, check_int, resolve_int, resolve_packing

__all__ = ["MAX_ELEMENTS", "applicable_checks", "build_case", "case_elements", "spec_violation"]

# Elements of the largest tensor of a case (x: batch x dim x time). 2^31 is where int32
# indexing breaks in most kernels and is 8 GiB in float32: past any test a matrix means to run.
MAX_ELEMENTS = 2**31 - 1


def case_elements(case: Case) -> int:
    """Elements of the case's largest tensor: batch x dim x time (seqlen; for an update the
    tokens of all its steps, or the state when longer). What ``MAX_ELEMENTS`` and
    ``convmatrix explore --max-elements`` bound."""
    time = case.seqlen if case.op != "update" else (case.tokens or 0) * (case.steps or 0)
    return case.batch * case.dim * max(time or 0, case.state_len or 0, 1)


def _check_size(suite: SuiteSpec, values: Mapping[str, Value], case: Case) -> None:
    elements = case_elements(case)
    time = case.seqlen if case.op != "update" else (case.tokens or 0) * (case.steps or 0)
    if elements > MAX_ELEMENTS:
        sizes = {d: getattr(case, d) or 0 for d in ("batch", "dim", "seqlen") if d in values}
        v = values[max(sizes, key=sizes.__getitem__)]  # point at the largest factor
        raise MatrixError(
            v.mark,
            v.path,
            f"suite {suite.name}: batch {case.batch} x dim {case.dim} x time {time} = "
            f"{elements} elements in one tensor, over the limit of {MAX_ELEMENTS} (2^31-1)",
        )


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

    def number(dim: str) -> int:  # symbols resolved: a product may now be out of range
        return check_int(resolve_int(values[dim].data, env), values[dim])

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
    _check_size(suite, values, case)
    wanted = suite.checks if checks is None else checks
    checks_ = applicable_checks(case, wanted)  # not part of the id: the id is not hashed again
    return Case(**{**fields, "checks": checks_, "id": case.id})  # type: ignore[arg-type]


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
