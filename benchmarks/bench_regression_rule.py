"""Choosing the error-regression rule's factor and floor: benign changes against precision
defects, side by side in one run.

    python benchmarks/bench_regression_rule.py [--matrix nightly] [--workers 2] [--sample N]
        [--factors 2 3 4 ...] [--floors 0.01 0.03 ...] [--out rows.jsonl] [--load rows.jsonl]

Every case of the matrix (expected errors aside) is run once by every kernel below, case by
case in one process per job (``runners.case.execute.run_case`` under the default ``bound``
policy), and the runs are then compared pairwise with the real rule (``compare.runs``,
``compare.errors``) under each (factor, floor) of a grid, each run carrying what its kernel
declares (``Declared``), as a recorded run does:

- baselines: ``torch`` and ``tiled``, the built-in kernels, and ``fp32``, the honest FP32
  kernel the variants and defects are built on (``kernels.doubles.defects.Fp32Kernel``);
- benign variants of ``fp32`` (``kernels.doubles.variants``): sums in order, reversed,
  sequential, compensated (Kahan), in float64, and shuffled anew on every call (declaring
  ``deterministic=False``), that one run twice (``shuffled``, ``shuffled#2``);
- precision defects (``kernels.doubles.defects``): the six of ``DEFECTS``, which fail cases,
  and ``ChoppedRunningSum`` (``SUBTLE``), which stays under its bound on nightly.

Benign pairs are every ordered pair of the kernels declaring FP32 accumulation and FP32
intermediates (``tiled``, ``fp32`` and the variants: swaps between kernels of one declared
arithmetic, and changes to and from each variant) and the two runs of ``shuffled`` (a
nondeterministic kernel run again at the same commit): the rule must call none of them a
regression. Defect pairs are each baseline against each defect: each defect must raise at
least one error regression, the subtle one on cases that still pass. ``torch`` declares
``intermediate="input"`` (a wider bound): its pairs with the FP32 kernels are judged by the
e_rel/e_norm fallback, shown apart, with what the usage rule would have said had it been
applied anyway. ``--out`` keeps every result (JSON lines) and ``--load`` judges them again
without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

DEFECTS = "convmatrix.kernels.doubles.defects"
VARIANTS = "convmatrix.kernels.doubles.variants"
BASELINES = {"torch": "torch", "tiled": "tiled", "fp32": f"{DEFECTS}:Fp32Kernel"}
BENIGN = {
    "in_order": f"{VARIANTS}:InOrderSums",
    "reversed": f"{VARIANTS}:ReversedSums",
    "sequential": f"{VARIANTS}:SequentialSums",
    "kahan": f"{VARIANTS}:KahanSums",
    "float64": f"{VARIANTS}:Float64Sums",
    "shuffled": f"{VARIANTS}:ShuffledSums",
    "shuffled#2": f"{VARIANTS}:ShuffledSums",  # a second run of the nondeterministic kernel
}
FAILING = ("HalfAccumulation", "HalfTanhSilu", "StorageIntermediates", "HalfTreeReduction",
           "HalfRunningSum", "Bf16Products")  # fmt: skip
DEFECT_KERNELS = {name: f"{DEFECTS}:{name}" for name in (*FAILING, "ChoppedRunningSum")}
KERNELS = {**BASELINES, **BENIGN, **DEFECT_KERNELS}
FACTORS = (2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 16.0, 32.0, 64.0)
FLOORS = (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0)


def _run(job: tuple[str, list[str]]) -> list[dict[str, Any]]:
    """Every kernel on every case of the job, case by case (they share the torch path's
    outputs: ``CaseMemo``)."""
    import torch

    torch.set_num_threads(1)
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.case.execute import CaseMemo, Context, run_case
    from convmatrix.runners.run.workload import load_workload

    matrix, ids = job
    memo = CaseMemo()
    contexts = {label: Context(load(spec), memo=memo) for label, spec in KERNELS.items()}
    by_id = {c.id: c for c in load_workload(matrix, contexts["tiled"].kernel).cases}
    rows = []
    for case_id in ids:
        for label, ctx in contexts.items():
            result = run_case(by_id[case_id], ctx)
            rows.append({"kernel": label, "result": result.to_json()})
    return rows


def _cost(case: Any) -> int:
    length = case.seqlen or (case.tokens or 1) * (case.steps or 1)
    return case.batch * case.dim * length


def measure(matrix: str, workers: int, sample: int | None) -> list[dict[str, Any]]:
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.run.workload import load_workload

    cases = [c for c in load_workload(matrix, load("tiled")).cases if c.expect != "error"]
    if sample and len(cases) > sample:
        cases = cases[:: math.ceil(len(cases) / sample)]
    cases.sort(key=_cost, reverse=True)  # the biggest first: the pool ends together
    jobs = [(matrix, [c.id for c in cases[i : i + 2]]) for i in range(0, len(cases), 2)]
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        for n, part in enumerate(pool.map(_run, jobs), 1):
            rows += part
            if n % 10 == 0 or n == len(jobs):
                took = time.perf_counter() - start
                print(f"  {matrix}: {n}/{len(jobs)} jobs, {took:.0f} s", flush=True)
    return rows


def _declared() -> dict[str, Any]:
    """Each kernel's declared arithmetic, as its run records it."""
    from convmatrix.compare.errors import Declared
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.run.controller import declared_arithmetic

    return {label: Declared.of(declared_arithmetic(load(spec))) for label, spec in KERNELS.items()}


def _runs(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    from convmatrix.core.records import CaseResult

    runs: dict[str, list[Any]] = {label: [] for label in KERNELS}
    for row in rows:
        runs[row["kernel"]].append(CaseResult.from_json(row["result"]))
    return runs


def _pairs(declared: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    same = ["tiled", "fp32", *(k for k in BENIGN if k != "shuffled#2")]
    benign = [(b, h) for b in same for h in same if b != h] + [("shuffled", "shuffled#2")]
    assert all(declared[b].same_bound(declared[h]) for b, h in benign)
    cross = [pair for k in same for pair in (("torch", k), (k, "torch"))]
    defects = [(b, d) for d in DEFECT_KERNELS for b in BASELINES]
    return {"benign": benign, "cross": cross, "defects": defects}


def _judge(runs, declared, base: str, head: str, factor: float, floor: float, usage: bool = True):
    """The comparison of two runs under the rule (factor, floor); ``usage=False`` strips the
    usage, so the e_rel/e_norm rule of before judges."""
    from convmatrix.compare.errors import ErrorRule
    from convmatrix.compare.runs import DiffOptions, compare_runs

    b, h = runs[base], runs[head]
    if not usage:
        b, h = _stripped(b), _stripped(h)
    opts = DiffOptions(errors=ErrorRule(factor=factor, floor=floor))
    return compare_runs(b, h, opts, declared=(declared[base], declared[head]))


def _stripped(results: list[Any]) -> list[Any]:
    return [replace(r, outputs=[replace(m, bound_usage=None) for m in r.outputs]) for r in results]


def _counts(view, head_results) -> dict[str, Any]:
    """What the rule raised: error regressions, those on cases head still passes, their
    largest growth, and new failures."""
    passing = {r.case.id for r in head_results if r.outcome == "passed"}
    regs = view.error_regressions
    on_passing = [e for e in regs if e.case_id in passing]
    return {
        "regressions": len(regs),
        "cases": len({e.case_id for e in regs}),
        "on_passing": len(on_passing),
        "passing_cases": len({e.case_id for e in on_passing}),
        "usage": sum(e.measure == "usage" for e in regs),
        "fallback": sum(e.measure != "usage" for e in regs),
        "max_growth": max((e.growth for e in regs), default=None),
        "new_failures": len(view.new_failures),
    }


def _max_benign_growth(runs, pairs, floor: float) -> tuple[float, str]:
    """The largest usage growth among ``pairs`` of outputs ending above ``floor``."""
    best, where = 0.0, ""
    for base, head in pairs:
        b = {r.case.id: {m.output: m for m in r.outputs} for r in runs[base]}
        for r in runs[head]:
            for m in r.outputs:
                bm = b.get(r.case.id, {}).get(m.output)
                if bm is None or bm.bound_usage is None or m.bound_usage is None:
                    continue
                if m.bound_usage > floor and bm.bound_usage > 0:
                    g = m.bound_usage / bm.bound_usage
                    if g > best:
                        best, where = g, f"{base} -> {head} {m.output} ({r.case.pytest_id})"
    return best, where


def report(rows: list[dict[str, Any]], factors, floors, chosen: tuple[float, float]) -> None:
    runs = _runs(rows)
    declared = _declared()
    pairs = _pairs(declared)
    n = len(runs["tiled"])
    print(f"\n{n} cases; outcomes: " + "; ".join(
        f"{k} {dict(Counter(r.outcome for r in v))}" for k, v in runs.items()
    ))  # fmt: skip
    print("\nusage per kernel (max over cases and outputs; median of the per-case maxima)")
    for label, results in runs.items():
        peaks = sorted(max((m.bound_usage or 0.0 for m in r.outputs), default=0.0) for r in results)
        print(f"  {label}: max {peaks[-1]:.3g}, median {peaks[len(peaks) // 2]:.3g}")

    print(f"\nerror regressions the rule raises over the {len(pairs['benign'])} benign pairs / "
          "outputs of cases that still pass flagged for ChoppedRunningSum (against tiled) / "
          f"defects raising one (of {len(DEFECT_KERNELS)}, against tiled)")  # fmt: skip
    print("| floor \\ factor | " + " | ".join(f"{f:g}" for f in factors) + " |")
    print("|---|" + "---|" * len(factors))
    for floor in floors:
        cells = []
        for factor in factors:
            benign = sum(
                len(_judge(runs, declared, b, h, factor, floor).error_regressions)
                for b, h in pairs["benign"]
            )
            raised = sum(
                bool(_judge(runs, declared, b, d, factor, floor).error_regressions)
                for b, d in pairs["defects"]
                if b == "tiled"
            )
            subtle = _counts(
                _judge(runs, declared, "tiled", "ChoppedRunningSum", factor, floor),
                runs["ChoppedRunningSum"],
            )
            cell = f"{benign} / {subtle['on_passing']} / {raised}"
            cells.append(f"**{cell}**" if (factor, floor) == chosen else cell)
        print(f"| {floor:g} | " + " | ".join(cells) + " |")

    print("\nlargest usage growth of a benign pair, among outputs ending above the floor:")
    for floor in floors:
        g, where = _max_benign_growth(runs, pairs["benign"], floor)
        print(f"  floor {floor:g}: x{g:.3g} ({where})")

    factor, floor = chosen
    same = [k for k in KERNELS if k in ("tiled", "fp32") or (k in BENIGN and k != "shuffled#2")]
    print(
        f"\nbenign pairs at factor {factor:g}, floor {floor:g}: each kernel as head (against "
        f"the {len(same) - 1} others) and as base; the e_rel/e_norm rule of before beside it"
    )
    print("| kernel | as head: error regressions | largest usage growth above the floor | "
          "e_rel rule | as base: error regressions | largest growth | e_rel rule |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rows_of = {"head": lambda k: [(b, k) for b in same if b != k],
               "base": lambda k: [(k, h) for h in same if h != k]}  # fmt: skip
    for k in [*same, "shuffled -> shuffled#2"]:
        cells = []
        for side in ("head", "base"):
            chosen_pairs = [("shuffled", "shuffled#2")] if "#2" in k else rows_of[side](k)
            regs = sum(
                len(_judge(runs, declared, b, h, factor, floor).error_regressions)
                for b, h in chosen_pairs
            )
            old = sum(
                len(_judge(runs, declared, b, h, factor, floor, usage=False).error_regressions)
                for b, h in chosen_pairs
            )
            g, _ = _max_benign_growth(runs, chosen_pairs, floor)
            cells += [str(regs), f"x{g:.3g}" if g else "-", str(old)]
            if "#2" in k:
                cells += ["", "", ""]
                break
        print(f"| {k} | " + " | ".join(cells) + " |")

    print(
        "\nthe torch path (intermediate input) against each FP32 kernel: judged by e_rel/e_norm "
        "(declared arithmetic differs); what the usage rule would have said beside it"
    )
    print("| kernel | torch -> kernel | kernel -> torch | usage rule: torch -> kernel | "
          "usage rule: kernel -> torch |")  # fmt: skip
    print("|---|---|---|---|---|")
    alike = {k: declared["tiled"] for k in KERNELS}
    for k in same:
        cells = []
        for assumed in (declared, alike):
            for b, h in (("torch", k), (k, "torch")):
                c = _counts(_judge(runs, assumed, b, h, factor, floor), runs[h])
                cells.append(f"{c['regressions']} ({c['cases']})")
        print(f"| {k} | " + " | ".join(cells) + " |")

    print(
        f"\nprecision defects at factor {factor:g}, floor {floor:g} (tiled, then torch as "
        "baseline); largest usage growth among the outputs of cases that still pass"
    )
    print("| defect | error regressions (cases) | on passing cases | largest growth on passing "
          "cases | new failures | e_rel rule | against torch (by e_rel) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for d in DEFECT_KERNELS:
        c = _counts(_judge(runs, declared, "tiled", d, factor, floor), runs[d])
        old = _counts(_judge(runs, declared, "tiled", d, factor, floor, usage=False), runs[d])
        t = _counts(_judge(runs, declared, "torch", d, factor, floor), runs[d])
        passing = {r.case.id for r in runs[d] if r.outcome == "passed"}
        kept = {"tiled": [r for r in runs["tiled"] if r.case.id in passing],
                d: [r for r in runs[d] if r.case.id in passing]}  # fmt: skip
        g, _ = _max_benign_growth(kept, [("tiled", d)], floor)
        print(
            f"| {d} | {c['regressions']} ({c['cases']}) | {c['on_passing']} | "
            f"{f'x{g:.3g}' if g else '-'} | {c['new_failures']} | {old['regressions']} "
            f"({old['cases']}) | {t['regressions']} ({t['cases']}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="nightly")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--sample", type=int, default=None, help="about N cases, evenly taken")
    parser.add_argument("--factors", type=float, nargs="+", default=list(FACTORS))
    parser.add_argument("--floors", type=float, nargs="+", default=list(FLOORS))
    parser.add_argument("--out", type=Path, help="write every result here (JSON lines)")
    parser.add_argument("--load", type=Path, help="judge the results of an earlier --out")
    args = parser.parse_args()
    from convmatrix.compare.errors import DEFAULT_FACTOR, DEFAULT_FLOOR

    if args.load:
        rows = [json.loads(line) for line in args.load.read_text().splitlines() if line]
    else:
        start = time.perf_counter()
        rows = measure(args.matrix, args.workers, args.sample)
        print(f"ran {len(rows)} (kernel, case) results in {time.perf_counter() - start:.0f} s")
        if args.out:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report(rows, args.factors, args.floors, (DEFAULT_FACTOR, DEFAULT_FLOOR))


if __name__ == "__main__":
    main()
