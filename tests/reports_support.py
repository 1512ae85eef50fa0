"""Synthetic runs for the report tests and benchmarks: real ``CaseResult`` records, stored with
the real ``ResultWriter`` in a real database.

The errors are drawn at the scale a correct kernel shows (about one unit roundoff of the dtype)
from a generator seeded per case, so two "commits" of the same correct kernel give identical
numbers and a diff of them is empty. ``bug`` names the cases a seeded bug breaks: their errors
become O(1) and they fail, like a tile-boundary bug in FP32 would. With ``usage=True`` every
output also records its bound usage and is judged by it, as under the default ``bound``
policy: up to 0.95 for a correct kernel, 50 to 500 for a broken output.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from functools import cache

from sqlalchemy import Engine

from convmatrix.core.case import Case
from convmatrix.core.records import CaseResult, OutputMetrics, RunMeta, TimingResult
from convmatrix.core.tolerances import Tolerances
from convmatrix.db import ResultWriter

UNIT = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
GEOMETRY = {"time_tile": 64, "channel_tile": 32, "vector_width": 8, "partial_groups": None}
XSS = "<script>alert(1)</script>"


@cache
def _grid() -> tuple[Case, ...]:
    """Every distinct case of a grid over the main dimensions (11520), in a fixed shuffled
    order so that the first few hundred still cover every dtype, op and layout."""
    grid = itertools.product(
        ("float32", "bfloat16", "float16"),
        ("fwd", "fwd_bwd"),
        (2, 3, 4),
        ("channel_first", "channel_last"),
        (1, "K-1", "K", 63, 64, 65, 129),
        (8, 40),
        (1, 2),
        (None, "silu"),
        ("none", "zeros", "random"),
        (True, False),
    )
    out: dict[str, Case] = {}
    for dtype, op, k, layout, length, dim, batch, act, init, bias in grid:
        seqlen = {"K-1": k - 1, "K": k}.get(length, length)  # type: ignore[arg-type]
        case = Case(
            suite="synthetic", op=op, width=k, dim=dim, batch=batch, x_dtype=dtype,
            w_dtype=dtype, layout=layout, activation=act, bias=bias, seqlen=max(int(seqlen), 1),
            initial_state=init, final_state=init != "none",
            dfinal="random" if op == "fwd_bwd" and init != "none" else None,
        )  # fmt: skip
        out.setdefault(case.id, case)
    shuffled = list(out.values())
    random.Random(0).shuffle(shuffled)
    return tuple(shuffled)


def cases(n: int) -> list[Case]:
    """The first ``n`` cases of the shuffled grid."""
    return list(_grid()[:n])


def outputs_of(case: Case) -> list[str]:
    names = ["y"] + (["F"] if case.final_state else [])
    if case.op == "fwd_bwd":
        names += ["dx", "dw"] + (["db"] if case.bias else [])
        names += ["dS"] if case.initial_state != "none" else []
    return names


def _metrics(
    case: Case, output: str, rng: random.Random, broken: bool, usage: bool = False
) -> OutputMetrics:
    tol = Tolerances().lookup(case.x_dtype, output)
    u = UNIT[case.x_dtype] * (4 if output in ("dw", "db") else 1)
    e_rel = 0.5 + 0.4 * rng.random() if broken else u * (0.5 + 2 * rng.random())
    e_norm = 0.2 + 0.2 * rng.random() if broken else u * (0.1 + 0.5 * rng.random())
    metrics = OutputMetrics(
        output=output, e_abs=e_rel * 1.3, e_rel=e_rel, e_norm=e_norm, tau=1e-3, scale=1.0,
        worst_index=[0, 1, 2], fw_abs=u, fw_rel=u * 1.5, fw_norm=u * 0.4,
        limit_rel=tol.rel, limit_norm=tol.norm,
        passed=e_rel <= tol.rel and e_norm <= tol.norm,
    )  # fmt: skip
    if usage:
        drawn = 50 * 10 ** rng.random() if broken else 0.05 + 0.9 * rng.random()
        metrics.bound_usage, metrics.usage_limit = drawn, 2.0
        metrics.broken_zeros, metrics.passed = 0, drawn <= 2.0
    return metrics


def result_for(
    case: Case,
    *,
    broken: bool = False,
    timing_scale: float = 1.0,
    timed: bool = False,
    usage: bool = False,
) -> CaseResult:
    """A plausible result of one case; deterministic in the case id."""
    rng = random.Random(case.id)
    outputs = [_metrics(case, o, rng, broken, usage) for o in outputs_of(case)]
    timings = []
    if timed:
        samples = [timing_scale * 1e-4 * (1 + 0.02 * rng.random()) for _ in range(9)]
        samples.sort()
        timings.append(
            TimingResult(
                scope="kernel", median_s=samples[4], min_s=samples[0],
                iqr_s=samples[6] - samples[2], n=9, cold_s=5e-3, samples=samples,
                floor_s=2e-5, efficiency=2e-5 / samples[4],
            )
        )  # fmt: skip
    return CaseResult(
        case=case,
        outcome="passed" if all(o.passed for o in outputs) else "failed",
        duration_s=0.01,
        message=None if all(o.passed for o in outputs) else "outputs outside their limits",
        outputs=outputs,
        timings=timings,
    )


def tile_plus_one_channel_last(case: Case) -> bool:
    """The seeded bug: wrong halo on the tile+1 tail, only with the channel-last layout."""
    return case.seqlen == GEOMETRY["time_tile"] + 1 and case.layout == "channel_last"


def synthetic_results(
    n: int,
    *,
    bug: Callable[[Case], bool] | None = None,
    timed_every: int = 0,
    timing_scale: float = 1.0,
    extras: bool = True,
    usage: bool = False,
) -> list[CaseResult]:
    """``n`` numeric results (plus, with ``extras``, an expected-error case whose kernel message
    is an XSS attempt, a crashed case and a skipped one); ``usage``: judged by bound usage."""
    results = [
        result_for(
            c,
            broken=bool(bug and bug(c)),
            timed=bool(timed_every) and i % timed_every == 0,
            timing_scale=timing_scale,
            usage=usage,
        )
        for i, c in enumerate(cases(n))
    ]
    if extras:
        results += extra_results()
    return results


def extra_results() -> list[CaseResult]:
    base = dict(suite="extras", op="fwd", width=5, dim=8, batch=1, seqlen=16)
    raised = Case(**base, expect="error", expect_reason="width 5 is not supported")  # type: ignore[arg-type]
    crashed = Case(**base, x_dtype="bfloat16", w_dtype="bfloat16")  # type: ignore[arg-type]
    skipped = Case(**base, seq_lens=(8, 8))  # type: ignore[arg-type]
    return [
        CaseResult(raised, "passed", message=f"ContractError: bad width {XSS}"),
        CaseResult(crashed, "crashed", message=f"worker died: signal 6 {XSS}"),
        CaseResult(skipped, "skipped", message="kernel lacks feature 'packed'"),
    ]


def write_run(
    engine: Engine,
    results: Sequence[CaseResult],
    *,
    kernel: str = "tiled",
    commit: str | None = "a" * 40,
    label: str | None = None,
    matrix: str = "nightly",
    kind: str = "run",
    arithmetic: dict | None = None,
) -> int:
    """Store ``results`` as one finished run through the real writer; returns the run id.
    ``arithmetic``: the kernel's declared arithmetic, as a run records it."""
    with ResultWriter(engine, batch_size=1000) as writer:
        run_id = writer.start_run(
            RunMeta(
                kernel=kernel, matrix=matrix, matrix_hash="f" * 64, kernel_commit=commit,
                label=label, versions={"torch": "2.13.0", "convmatrix": "0.1.0"},
                geometry=GEOMETRY, n_planned=len(results), argv=["convmatrix", "run"],
                kind=kind,
                options={"arithmetic": arithmetic} if arithmetic else {},
            )
        )  # fmt: skip
        for r in results:
            writer.add(r)
    return run_id
