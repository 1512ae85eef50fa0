"""Judging a Mamba-sized case: channel blocks and huge pages against whole-tensor passes.

    python benchmarks/bench_blocks.py [--kernel torch] [--rounds 3]

The harness's own work on a large case (inputs, float64 reference with magnitudes, bounds,
metrics) makes dozens of passes over tensors of B*C*L elements; at C=4128, L=4096 each is 270
MB of float64. Three settings, each in a fresh process (c10 reads THP_MEM_ALLOC_ENABLE once),
alternated round by round so the machine's load falls on all; CPU seconds of ``run_case`` on
one case, best of the rounds, and ratios to the first setting:

- ``blocks+thp``: the default blocks (``runners.case.reference.BLOCK_ELEMENTS``) on huge pages
  (``THP_MEM_ALLOC_ENABLE=1``, opt-in: see docs/benchmarks.md);
- ``whole+thp``: one block per output, the whole tensor per pass;
- ``blocks-thp``: channel blocks with 4 KiB pages.

Measured on the 2-core host (torch, one round): 8.4 s, 12.5 s (x1.50), 9.9 s (x1.18). The
harness before blocks, in-place passes and huge pages took 34 s on the same case.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CASE = dict(
    suite="bench", op="fwd_bwd", width=4, dim=4128, batch=2, seqlen=4096, activation="silu",
    bias=True, initial_state="random", final_state=True, dfinal="random", layout="channel_last",
    gap="channel_slice",
)  # fmt: skip

CHILD = """
import sys, time
import convmatrix
import torch
torch.set_num_threads(1)
from convmatrix.core.case import Case
from convmatrix.kernels.interface.registry import load
from convmatrix.runners.case import reference
from convmatrix.runners.case.execute import Context, run_case
if sys.argv[2] == "whole":
    reference.BLOCK_ELEMENTS = 1 << 62
case = Case(**eval(sys.argv[3]))
ctx = Context(load(sys.argv[1]))
run_case(case, ctx)  # first call: imports, allocator warm-up
start = time.process_time()
result = run_case(case, ctx)
print(time.process_time() - start, result.outcome)
"""

SETTINGS = {
    "blocks+thp": ("blocks", "1"),
    "whole+thp": ("whole", "1"),
    "blocks-thp": ("blocks", "0"),
}


def timed(kernel: str, setting: str) -> float:
    blocks, thp = SETTINGS[setting]
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": thp}
    cmd = [sys.executable, "-c", CHILD, kernel, blocks, repr(CASE)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    seconds, outcome = out.split()
    if outcome != "passed":
        sys.exit(f"{setting}: the case {outcome}")
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    best = dict.fromkeys(SETTINGS, float("inf"))
    for _ in range(args.rounds):
        for setting in SETTINGS:
            best[setting] = min(best[setting], timed(args.kernel, setting))
    base = best["blocks+thp"]
    print(
        f"{args.kernel}, fwd_bwd K=4 L=4096 C=4128 B=2, CPU s of run_case (best of {args.rounds})"
    )
    for setting, seconds in best.items():
        print(f"  {setting:12s} {seconds:6.2f} s  x{seconds / base:.2f}")


if __name__ == "__main__":
    main()
