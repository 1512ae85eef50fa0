"""Verdicts that follow the arithmetic: false alarms of honest kernels, detection of defects.

    python benchmarks/bench_bounds.py [--matrices production nightly dao-parity]
        [--kernels torch tiled reference] [--defects] [--sample N] [--workers 2]

Each case is run once (``runners.execute.run_case`` under the default ``bound`` policy, the
torch path beside it) and judged afterwards under every policy from what the run records:
``bound`` (bound usage <= safety), ``threshold`` (the rows' usage <= 1), ``old_threshold``
(the rows as judged before the bound model: dw/db by the coarser of the x and weight dtype),
``framework`` (e_rel and e_norm <= factor x the torch path's + floor) and
``threshold_or_framework``. A failing
property check (causality, packed isolation, chunk consistency, guards) fails the case under
every policy: those checks do not depend on the policy's rows. ``--sample N`` takes every
k-th case so that about N are run (say so when you quote the figure). ``--defects`` runs the
precision-defect kernels of ``convmatrix.kernels.defects`` instead of the honest kernels.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

POLICIES = ("bound", "threshold", "old_threshold", "framework", "threshold_or_framework")
HONEST = ("torch", "tiled", "reference")


def _framework_ok(o: Any, factor: float = 2.0, floor: float = 1e-6) -> bool:
    if o.fw_rel is None or not (math.isfinite(o.fw_rel) and math.isfinite(o.fw_norm)):
        return o.limit_usage is not None and o.limit_usage <= 1
    return o.e_rel <= factor * o.fw_rel + floor and o.e_norm <= factor * o.fw_norm + floor


def _old_row_ok(result: Any, o: Any) -> bool:
    from convmatrix.core.dtypes import coarser
    from convmatrix.core.tolerances import DEFAULT_TOLERANCES, PARAM_GRADS

    case = result.case
    dtype = coarser(case.x_dtype, case.w_dtype) if o.output in PARAM_GRADS else case.x_dtype
    row = DEFAULT_TOLERANCES[(dtype, o.output)]
    return o.e_rel <= row.rel and o.e_norm <= row.norm


def verdicts(result: Any) -> dict[str, bool]:
    """passed under each policy, from one recorded result."""
    if result.outcome not in ("passed", "failed"):
        return {p: result.outcome == "skipped" for p in POLICIES}
    props = all(p.passed for p in result.properties)
    exact = all(o.limit_usage is not None or o.passed for o in result.outputs)
    outs = [o for o in result.outputs if o.limit_usage is not None]
    if result.message and not result.outputs:  # the kernel raised
        return dict.fromkeys(POLICIES, False)
    thr = all(o.limit_usage <= 1 for o in outs)
    fw = all(_framework_ok(o) for o in outs)
    bound = all(o.bound_usage is None or o.bound_usage <= 2.0 for o in outs)
    base = props and exact
    return {
        "bound": base and bound,
        "threshold": base and thr,
        "old_threshold": base and all(_old_row_ok(result, o) for o in outs),
        "framework": base and fw,
        "threshold_or_framework": base
        and all(o.limit_usage <= 1 or _framework_ok(o) for o in outs),
    }


def _run(job: tuple[str, str, list[str]]) -> list[tuple[str, dict[str, bool], dict[str, float]]]:
    import torch

    torch.set_num_threads(1)
    from convmatrix.kernels.registry import load
    from convmatrix.runners.execute import Context, run_case
    from convmatrix.runners.workload import load_workload

    matrix, spec, ids = job
    kernel = load(spec)
    wanted = set(ids)
    cases = [c for c in load_workload(matrix, kernel).cases if c.id in wanted]
    ctx = Context(kernel)
    out = []
    for case in cases:
        r = run_case(case, ctx)
        usage = {o.output: o.bound_usage or 0.0 for o in r.outputs}
        out.append((r.outcome, verdicts(r), usage))
    return out


def measure(matrix: str, spec: str, sample: int | None, workers: int) -> dict[str, Any]:
    from convmatrix.kernels.registry import load
    from convmatrix.runners.workload import load_workload

    cases = [c for c in load_workload(matrix, load(spec)).cases if c.expect != "error"]
    total = len(cases)
    if sample and total > sample:
        step = math.ceil(total / sample)
        cases = cases[::step]
    ids = [c.id for c in cases]
    chunks = [ids[i :: workers * 4] for i in range(workers * 4)]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        rows = [
            r for part in pool.map(_run, [(matrix, spec, c) for c in chunks if c]) for r in part
        ]
    elapsed = time.perf_counter() - start
    fails = Counter()
    worst: dict[str, float] = {}
    outcomes = Counter(r[0] for r in rows)
    for _, v, usage in rows:
        for p, ok in v.items():
            fails[p] += not ok
        for k, u in usage.items():
            worst[k] = max(worst.get(k, 0.0), u)
    return {
        "matrix": matrix,
        "kernel": spec,
        "run": len(rows),
        "of": total,
        "fails": dict(fails),
        "worst_usage": worst,
        "outcomes": dict(outcomes),
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", nargs="+", default=["production", "nightly"])
    parser.add_argument("--kernels", nargs="+", default=None)
    parser.add_argument("--defects", action="store_true")
    parser.add_argument("--sample", type=int, default=None)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    if args.kernels:
        kernels = args.kernels
    elif args.defects:
        from convmatrix.kernels.defects import DEFECTS

        kernels = [f"convmatrix.kernels.defects:{name}" for name in DEFECTS]
    else:
        kernels = list(HONEST)
    print("matrix | kernel | cases run | " + " | ".join(POLICIES) + " | worst bound usage | s")
    for matrix in args.matrices:
        for spec in kernels:
            m = measure(matrix, spec, args.sample, args.workers)
            fails = " | ".join(str(m["fails"].get(p, 0)) for p in POLICIES)
            worst = ", ".join(f"{k} {v:.2f}" for k, v in sorted(m["worst_usage"].items()))
            name = spec.rsplit(":", 1)[-1]
            print(
                f"{matrix} | {name} | {m['run']}/{m['of']} | {fails} | {worst} | "
                f"{m['seconds']:.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
