"""The thread policy beside a busy neighbour: today's default (``auto``) vs the policy of before
(``--threads torch``) vs the same run at one thread (``OMP_NUM_THREADS=1``), quiet and beside a
CPU-bound process this benchmark starts itself. Targets: beside the neighbour, ``auto`` within
1.3x of the run at one thread; quiet, ``auto`` no slower than ``torch``.

    python benchmarks/bench_threads.py [--rounds 2] [--only nightly mamba] [--neighbours 1]

Workloads: ``nightly -n 0`` and one Mamba-sized forward case (K=4, L=4096, C=4128, B=2;
benchmarks/mamba.matrix.yaml), each the whole ``convmatrix run`` command (start-up included,
no database, no reference cache). Rounds alternate the policies and the load, so whatever
else the machine runs falls on all of them; the best of each is kept. The neighbour is
``while True: pass`` in its own process (one per ``--neighbours``), started before a load's
runs and ended after them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {"nightly": "nightly", "mamba": str(HERE / "mamba.matrix.yaml")}
POLICIES = {  # name -> (extra arguments, extra environment)
    "torch": (["--threads", "torch"], {}),
    "auto": ([], {}),
    "one": ([], {"OMP_NUM_THREADS": "1"}),
}
NEAR = 1.3  # auto beside the neighbour, over the same run at one thread
OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CONVMATRIX_THREADS")


@contextlib.contextmanager
def neighbours(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # let them take their cores
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def timed_run(matrix: str, policy: str) -> float:
    """Seconds of wall time for ``convmatrix run --matrix MATRIX -n 0`` under ``policy``."""
    extra, env_extra = POLICIES[policy]
    env = {k: v for k, v in os.environ.items() if k not in OMP} | env_extra
    cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix, "--kernel", "torch"]
    cmd += ["-n", "0", "--no-db", "--reference-cache", "off", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"convmatrix run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=tuple(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--neighbours", type=int, default=1)
    args = parser.parse_args()
    times: dict[tuple[str, str, str], list[float]] = {}
    loads = ("quiet", "neighbour")
    for round_ in range(args.rounds):
        for load in loads if round_ % 2 == 0 else loads[::-1]:
            with neighbours(args.neighbours if load == "neighbour" else 0):
                for name in args.only:
                    order = list(POLICIES) if round_ % 2 == 0 else list(POLICIES)[::-1]
                    for policy in order:
                        seconds = timed_run(WORKLOADS[name], policy)
                        times.setdefault((name, load, policy), []).append(seconds)
                        print(f"round {round_ + 1} {load:9} {name:8} {policy:6} {seconds:7.2f} s")
    print(f"\nbest of {args.rounds} (s); load {os.getloadavg()[0]:.1f} at the end")
    for name in args.only:
        best = {(load, p): min(times[name, load, p]) for load in loads for p in POLICIES}
        for load in loads:
            cells = "  ".join(f"{p} {best[load, p]:6.2f}" for p in POLICIES)
            print(f"{name:8} {load:9} {cells}")
        near = best["neighbour", "auto"] / best["neighbour", "one"]
        quiet = best["quiet", "auto"] / best["quiet", "torch"]
        gain = best["neighbour", "torch"] / best["neighbour", "auto"]
        print(
            f"{name:8} beside the neighbour: auto / one thread {near:.2f} (target <= {NEAR}: "
            f"{'ok' if near <= NEAR else 'above'}), torch / auto {gain:.1f}x; quiet: auto / "
            f"torch {quiet:.2f} (target <= 1: {'ok' if quiet <= 1 else 'slower'})"
        )


if __name__ == "__main__":
    main()
