"""The reference cache, cold then warm: the same run twice, side by side in one process.

    python benchmarks/bench_refcache.py [--cases 3] [--kernel torch] [--matrix production]

Runs the ``--cases`` smallest forward cases of ``--matrix`` with ``--kernel`` twice into one
SQLite database, the first time into an empty reference cache, the second reading it, and
prints each run's phases as the runs record them (``cases.phases``) with the ratios, and
whether the two runs' verdicts and bound usages are identical. Target (issue "Device-bound
runs"): the warm run spends at least 10x less time in its reference phase, and less in all.
Figures: docs/devices.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from convmatrix.db.database import Database
from convmatrix.db.queries import load_results


def smallest(matrix: str, kernel: str, n: int) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "convmatrix", "expand", matrix, "--kernel",
                           kernel, "--format", "jsonl"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if r.get("op") != "update"]
    rows.sort(key=lambda r: r["batch"] * r["dim"] * (r.get("seqlen") or 1))
    return [r["id"] for r in rows[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="production")
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--cases", type=int, default=3)
    args = parser.parse_args()
    cases = smallest(args.matrix, args.kernel, args.cases)
    with tempfile.TemporaryDirectory() as tmp:
        db, cache = f"sqlite:///{tmp}/bench.db", str(Path(tmp) / "refs")
        walls = []
        for _ in range(2):
            argv = [sys.executable, "-m", "convmatrix", "run", "--matrix", args.matrix,
                    "--kernel", args.kernel, "-n", "0", "--db", db, "--reference-cache", cache,
                    *(a for c in cases for a in ("--case", c))]  # fmt: skip
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            walls.append(time.perf_counter() - start)
        with Database(db, existing=True) as database, database.reading() as session:
            runs = [load_results(session, run_id) for run_id in (1, 2)]
    phases = []
    for results in runs:
        total: dict[str, float] = {}
        for r in results:
            for name, s in r.phases.items():
                total[name] = total.get(name, 0.0) + s
        phases.append(total)
    print(f"{args.kernel} on {len(cases)} {args.matrix} cases; cold then warm cache")
    for name in phases[0]:
        cold, warm = phases[0][name], phases[1].get(name, 0.0)
        ratio = f"x{cold / warm:.1f}" if warm > 0 else "-"
        print(f"  {name:<11} {cold:8.2f} s  {warm:8.2f} s  {ratio}")
    print(f"  {'wall':<11} {walls[0]:8.2f} s  {walls[1]:8.2f} s  x{walls[0] / walls[1]:.2f}")
    same = [
        [(r.case.id, r.outcome, [(o.output, o.bound_usage) for o in r.outputs]) for r in rs]
        for rs in runs
    ]
    print(f"  verdicts and usages identical: {same[0] == same[1]}")
    reference = phases[0]["reference"] / max(phases[1].get("reference", 0.0), 1e-9)
    less = "less" if walls[1] < walls[0] else "NOT less"
    print(f"  reference phase x{reference:.1f} (target >= 10), wall {less}")


if __name__ == "__main__":
    main()
