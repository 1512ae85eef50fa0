"""What an interpreter's teardown costs, and what ending without it saves (``core.ending``).

    python benchmarks/bench_ending.py [--rounds 5]

A child process imports what a run's processes import (torch, the run pipeline, the xdist
plugin), takes one backward, and ends: as Python ends (its teardown), or through
``core.ending.end_process`` (threading's exit and the ``atexit`` hooks, then ``os._exit``).
Printed, per way and round (alternating): the wall time from the child's last statement to
this process seeing it exit (CLOCK_MONOTONIC is shared by both), and the CPU time of the
whole child; then the medians and their ratio. Nothing asserts them (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

CHILD = """
import sys, time
import torch
import convmatrix.pipeline.run, convmatrix.runners.executors.xdist.plugin
x = torch.randn(512, 512, requires_grad=True)
(x @ x).sum().backward()
sys.stderr.write("%.6f" % time.perf_counter())
sys.stderr.flush()
if sys.argv[1] == "end_process":
    from convmatrix.core.ending import end_process
    end_process(0, ran_kernel=False)
"""

WAYS = ("teardown", "end_process")


def _end_of(way: str) -> tuple[float, float]:
    """(seconds from the child's last statement to its exit seen here, CPU s of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True)
    seen = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the child ({way}) failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seen - float(done.stderr.strip().splitlines()[-1]), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ends: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in WAYS:
            end, cpu = _end_of(way)
            ends[way].append(end)
            print(f"round {r}  {way:<12} end {end:6.3f} s  child CPU {cpu:6.2f} s", flush=True)
    medians = {way: statistics.median(v) for way, v in ends.items()}
    for way, m in medians.items():
        print(f"median end  {way:<12} {m:6.3f} s")
    print(f"teardown / end_process: x{medians['teardown'] / medians['end_process']:.1f}")


if __name__ == "__main__":
    main()
