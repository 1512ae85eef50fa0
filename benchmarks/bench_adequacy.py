"""Mutation score and time of the shipped matrices against the seeded-bug catalogue.

    python benchmarks/bench_adequacy.py [--matrices smoke,nightly,minimized,dao-parity]
                                        [--sample 12] [-n 2] [--out DIR]

Each matrix runs through ``convmatrix adequacy`` as a fresh process (as CI types it) on a
fresh SQLite file: ``nightly`` with ``--minimize``, then ``minimized`` is the matrix that wrote
(its kills must equal nightly's), ``dao-parity`` a ``--sample`` of its cases (its full grid
is about 10,000 cases, beyond a CPU benchmark). Prints one markdown row per matrix: cases,
killed/total, score, wall seconds (every run, base included), CPU seconds of all its
processes, and the load average, since the machine's load moves the wall seconds. Targets
(docs/benchmarks.md): nightly 100%, smoke >= 90% in <= 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _cpu() -> float:
    """CPU seconds of every finished child process (adequacy and its pool workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _adequacy(matrix: str, out: Path, workers: str, *extra: str) -> tuple[dict, float, float]:
    db = f"sqlite:///{out / (Path(matrix).stem + '.db')}"
    argv = ["-m", "convmatrix", "adequacy", "--matrix", matrix, "-n", workers, "--db", db]
    start, cpu = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, *argv, "--out", str(out), *extra], text=True,
                          capture_output=True)  # fmt: skip
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
    if done.returncode not in (0, 1):
        sys.exit(f"adequacy {matrix} failed ({done.returncode}):\n{done.stderr}")
    name = next(line for line in done.stdout.splitlines() if line.startswith("report: "))
    view = json.loads(Path(name.removeprefix("report: ")).with_suffix(".json").read_text())
    return view, elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", default="smoke,nightly,minimized,dao-parity")
    parser.add_argument("--sample", type=int, default=12, help="dao-parity cases sampled")
    parser.add_argument("-n", dest="workers", default="2")
    parser.add_argument("--out", type=Path, default=Path("bench-adequacy"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    kills: dict[str, set[str]] = {}
    for matrix in args.matrices.split(","):
        extra: list[str] = []
        target = matrix
        if matrix == "nightly":
            extra = ["--minimize", str(args.out / "nightly-min.yaml")]
        elif matrix == "minimized":
            target = str(args.out / "nightly-min.yaml")
        elif matrix == "dao-parity":
            extra = ["--sample", str(args.sample)]
        view, seconds, cpu = _adequacy(target, args.out, args.workers, *extra)
        kills[matrix] = {b["name"] for b in view["bugs"] if b["killed"]}
        label = f"{matrix} (sample of {args.sample})" if matrix == "dao-parity" else matrix
        rows.append(
            f"| `{label}` | {len(view['cases'])} | {view['killed']}/{view['total']} "
            f"| {100 * view['score']:.1f}% | {seconds:.0f} s | {cpu:.0f} s "
            f"| {os.getloadavg()[0]:.1f} |"
        )
        print(rows[-1], flush=True)
    if "nightly" in kills and "minimized" in kills:
        same = kills["nightly"] == kills["minimized"]
        print(f"minimized kills the same bugs as nightly: {same}")
    print("| matrix | cases | killed | score | wall | CPU | load |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
