"""Verdicts that follow the arithmetic: false alarms of honest kernels, detection of defects.

    python benchmarks/bench_bounds.py [--matrices production nightly dao-parity]
        [--kernels torch tiled reference] [--defects] [--sample N] [--workers 2] [--out FILE]
        [--min-elements N] [--max-elements N]

Each case is run once (``runners.case.execute.run_case`` under the default ``bound`` policy, the
torch path beside it) and judged afterwards under every policy from what the run records:
``bound`` (bound usage <= safety), ``threshold`` (the rows' usage <= 1), ``old_threshold``
(the rows as judged before the bound model: dw/db by the coarser of the x and weight dtype),
``framework`` (e_rel and e_norm <= factor x the torch path's + floor) and
``threshold_or_framework``. Several kernels run case by case and share the torch path's
outputs (``CaseMemo``). ``--out FILE`` appends one JSON line per (kernel, case) as jobs end
and skips the cases FILE holds: a grid that takes hours survives an interruption. A failing
property check (causality, packed isolation, chunk consistency, guards) fails the case under
every policy: those checks do not depend on the policy's rows. ``--min-elements`` and
``--max-elements`` keep the cases whose B*C*L (B*C*tokens for updates) lies in that range.
``--sample N`` takes every k-th case so that about N are run (say so when you quote the
figure). ``--defects`` runs the precision-defect kernels of ``convmatrix.kernels.doubles.defects``
instead of the honest kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
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


def _cost(case: Any) -> int:
    """Elements a case moves: what its time grows with (biggest first balances the pool)."""
    length = case.seqlen or (case.tokens or 1) * (case.steps or 1)
    return case.batch * case.dim * length


def _run(job: tuple[str, list[str], list[str]]) -> list[dict[str, Any]]:
    """Every kernel on every case of the job, case by case: the kernels share the case's
    reference and torch path (``CaseMemo``)."""
    import torch

    torch.set_num_threads(1)
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.case.execute import CaseMemo, Context, run_case
    from convmatrix.runners.run.workload import load_workload

    matrix, specs, ids = job
    memo = CaseMemo()
    contexts = [Context(load(spec), memo=memo) for spec in specs]
    by_id = {c.id: c for c in load_workload(matrix, contexts[0].kernel).cases}
    rows = []
    for case_id in ids:
        for spec, ctx in zip(specs, contexts, strict=True):
            r = run_case(by_id[case_id], ctx)
            rows.append(
                {
                    "matrix": matrix,
                    "kernel": spec,
                    "case": case_id,
                    "outcome": r.outcome,
                    "verdicts": verdicts(r),
                    "usage": {o.output: o.bound_usage or 0.0 for o in r.outputs},
                    "seconds": r.duration_s,
                }
            )
    return rows


def measure(
    matrix: str,
    specs: list[str],
    sample: int | None,
    workers: int,
    out: Path | None,
    sizes: tuple[int, int] = (0, 2**62),
) -> list[dict[str, Any]]:
    """One row per (kernel, case); with ``out``, rows are appended as jobs finish and the
    cases it already holds are not run again (a long grid survives an interruption)."""
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.run.workload import load_workload

    cases = [c for c in load_workload(matrix, load(specs[0])).cases if c.expect != "error"]
    cases = [c for c in cases if sizes[0] <= _cost(c) <= sizes[1]]
    if sample and len(cases) > sample:
        cases = cases[:: math.ceil(len(cases) / sample)]
    wanted = {c.id for c in cases}
    rows = [r for r in _saved(out) if r["matrix"] == matrix and r["case"] in wanted]
    done = Counter(r["case"] for r in rows if r["kernel"] in specs)
    # Cheapest first: wherever the run stops, every case below some size has run.
    todo = sorted((c for c in cases if done[c.id] < len(specs)), key=_cost)
    jobs = [(matrix, specs, [c.id for c in todo[i : i + 4]]) for i in range(0, len(todo), 4)]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool, _appending(out) as sink:
        for n, part in enumerate(pool.map(_run, jobs), 1):
            rows += part
            for row in part:
                sink(row)
            if n % 25 == 0 or n == len(jobs):
                left = len(jobs) - n
                took = time.perf_counter() - start
                print(f"  {matrix}: {n}/{len(jobs)} jobs, {took:.0f} s, {left} left", flush=True)
    return [r for r in rows if r["kernel"] in specs]


def _saved(out: Path | None) -> list[dict[str, Any]]:
    if out is None or not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def _appending(out: Path | None):
    if out is None:
        yield lambda row: None
        return
    with out.open("a") as f:

        def sink(row: dict[str, Any]) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()

        yield sink


def summary(rows: list[dict[str, Any]], spec: str) -> dict[str, Any]:
    """Failures per policy, worst bound usage per output and seconds of one kernel's rows."""
    latest = {(r["kernel"], r["case"]): r for r in rows}  # a case run again: its last row
    mine = [r for (kernel, _), r in latest.items() if kernel == spec]
    fails: Counter = Counter()
    worst: dict[str, float] = {}
    for r in mine:
        for policy, ok in r["verdicts"].items():
            fails[policy] += not ok
        for k, u in r["usage"].items():
            worst[k] = max(worst.get(k, 0.0), u)
    return {
        "run": len(mine),
        "fails": dict(fails),
        "worst_usage": worst,
        "outcomes": dict(Counter(r["outcome"] for r in mine)),
        "seconds": sum(r["seconds"] for r in mine),
        "failed": [r["case"] for r in mine if not r["verdicts"]["bound"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", nargs="+", default=["production", "nightly"])
    parser.add_argument("--kernels", nargs="+", default=None)
    parser.add_argument("--defects", action="store_true")
    parser.add_argument("--sample", type=int, default=None)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=None, help="append rows here (JSON lines)")
    parser.add_argument("--min-elements", type=int, default=0, help="only cases of B*C*L >= N")
    parser.add_argument("--max-elements", type=int, default=2**62, help="only cases <= N")
    args = parser.parse_args()
    if args.kernels:
        kernels = args.kernels
    elif args.defects:
        from convmatrix.kernels.doubles.defects import DEFECTS

        kernels = [f"convmatrix.kernels.doubles.defects:{name}" for name in DEFECTS]
    else:
        kernels = list(HONEST)
    header = " | ".join(POLICIES)
    print(f"matrix | kernel | cases run | {header} | worst bound usage | case-seconds")
    for matrix in args.matrices:
        sizes = (args.min_elements, args.max_elements)
        rows = measure(matrix, kernels, args.sample, args.workers, args.out, sizes)
        for spec in kernels:
            m = summary(rows, spec)
            fails = " | ".join(str(m["fails"].get(p, 0)) for p in POLICIES)
            worst = ", ".join(f"{k} {v:.2f}" for k, v in sorted(m["worst_usage"].items()))
            name = spec.rsplit(":", 1)[-1]
            print(f"{matrix} | {name} | {m['run']} | {fails} | {worst} | {m['seconds']:.0f}")
            if m["failed"]:
                print(f"  failed under bound: {' '.join(m['failed'][:20])}", flush=True)


if __name__ == "__main__":
    main()
