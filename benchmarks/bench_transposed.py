"""Copies between channel-last and channel-first tensors: torch's ``copy_`` against
``runners.case.transposed.copy_into``, side by side in one process.

    python benchmarks/bench_transposed.py [--rounds 5] [--length 2048]

Per layout (dense, rows with a gap, a 63-channel block of a wide tensor: what a channel
block of the metrics reads), dtype and channel count, both directions: reading a
channel-last output into float64 in a channel-first reference's layout (``metrics.abs_diff``)
and placing contiguous values into a channel-last view (``inputs.place``). One thread; best
of ``--rounds``, the two copies alternated round by round; the ratio is torch's time over
``copy_into``'s (above 1: faster). Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from convmatrix.runners.case.transposed import copy_into

KINDS = {"dense": (0, 0), "gap": (16, 8), "block": (16, 8)}  # (extra channels, first channel)


def _seconds(fn, *args) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def side_by_side(dst: torch.Tensor, src: torch.Tensor, rounds: int) -> tuple[float, float]:
    """(torch's copy, ``copy_into``): the best CPU seconds of ``rounds``, alternated."""
    ours, theirs = [], []
    for _ in range(rounds):
        theirs.append(_seconds(dst.copy_, src))
        ours.append(_seconds(copy_into, dst, src))
    return min(theirs), min(ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{'dtype':9} {'C':>5} {'layout':6} {'read torch/ours ms':>20} {'place torch/ours ms':>21}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        for dim in (256, 1040, 4128):
            for kind, (extra, first) in KINDS.items():
                width = 63 if kind == "block" else dim
                storage = torch.randn(args.batch, args.length, dim + extra).to(dtype)
                view = storage.transpose(1, 2)[:, first : first + width]
                out = torch.empty(view.shape, dtype=torch.float64)
                values = torch.randn(view.shape).to(dtype)
                read = side_by_side(out, view, args.rounds)
                place = side_by_side(view, values, args.rounds)
                cells = [f"{a * 1e3:7.2f}/{b * 1e3:6.2f} x{a / b:4.1f}" for a, b in (read, place)]
                print(f"{str(dtype)[6:]:9} {dim:5} {kind:6} {cells[0]:>20} {cells[1]:>21}")


if __name__ == "__main__":
    main()
