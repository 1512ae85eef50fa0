"""Parallel scaling: ``convmatrix run -n 2`` vs ``-n 1`` on CPU-bound matrices. Target >= 1.7.

    python benchmarks/bench_scaling.py [--matrix nightly benchmarks/scaling.matrix.yaml]
                                       [--kernel torch] [--rounds 3] [--workers 1 2]

Each measurement is the whole ``convmatrix run`` command (start-up included, ``--no-db``), as
a user would time it. Each CPU worker gets one torch thread (the thread policy,
``runners.run.threads``; the figures in docs/benchmarks.md before it gave ``-n N`` cores // N
threads, so ``-n 1`` spread large tensor operations over every core), so the parallelism
comes from workers: ``-n 2`` overlaps two cases. Both kinds are measured: the built-in
``nightly`` matrix and ``scaling.matrix.yaml`` (48 mid-size cases). Rounds alternate the
worker counts so the machine's other load falls on all; the best of each is kept and the
speed-up over the first count is printed per matrix.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = 1.7


def timed_run(matrix: str, kernel: str, workers: int, *extra: str) -> float:
    """Wall seconds of one whole ``convmatrix run --no-db`` in a fresh process (start-up
    included); ``extra`` arguments go to ``run``. bench_executors uses it too."""
    cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix, "--kernel", kernel]
    cmd += ["-n", str(workers), "--no-db", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--matrix", nargs="+", default=["nightly", str(HERE / "scaling.matrix.yaml")]
    )
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    times = {(m, n): [] for m in args.matrix for n in args.workers}
    for round_ in range(args.rounds):
        for matrix in args.matrix:
            for n in args.workers:
                times[matrix, n].append(timed_run(matrix, args.kernel, n))
            line = ", ".join(f"-n {n} {times[matrix, n][-1]:.1f} s" for n in args.workers)
            print(f"round {round_ + 1} {Path(matrix).name}: {line}")
    base = args.workers[0]
    print(f"{cores} cores; best of {args.rounds} rounds:")
    for matrix in args.matrix:
        for n in args.workers:
            best = min(times[matrix, n])
            speedup = min(times[matrix, base]) / best
            note = ""
            if n == 2 * base:
                note = f" (target >= {TARGET}: {'ok' if speedup >= TARGET else 'below target'})"
            print(
                f"  {Path(matrix).name} -n {n}: {best:.2f} s, {speedup:.2f}x over -n {base}{note}"
            )


if __name__ == "__main__":
    main()
