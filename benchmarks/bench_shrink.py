"""Case runs to converge and the final shapes of ``shrink``, per size bug and a few catalogue
bugs, from a large failing case with every feature on.

    python benchmarks/bench_shrink.py [--bugs NAME,...] [--max-runs 60] [--json FILE]

Each start case is the bug's own trigger grown to a Mamba-sized case where the bug allows
(L=8192, C=1536, B=2, bias, SiLU, a random initial state, the final state with dF, two
packed sequences), on the CPU, one torch thread, the probe in process (the per-case
verdict is ``run_guarded``'s either way). Prints one markdown row per bug: case runs, wall
seconds, the start and the shrunk case, and the boundaries found; docs/search.md keeps the
table measured. The issue's target: the C > 1024 bug from L=8192, C=1536, B=2 to C just
above 1024, B=1, L at most one tile plus one, no bias, states or packing, in <= 60 runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from convmatrix.kernels.doubles.seeded import CATALOGUES, base_case
from convmatrix.runners.options import RunOptions
from convmatrix.search.probe import Probe
from convmatrix.search.shrink import shrink

MAMBA: dict[str, Any] = {
    "seqlen": 8192, "dim": 1536, "batch": 2, "activation": "silu",
    "initial_state": "random", "final_state": True, "dfinal": "random",
    "seq_lens": (4096, 4096),
}  # fmt: skip
# Start cases: the Mamba-sized case over the bug's trigger (the features its trigger needs
# stay on), then a start of its own where a Mamba-sized case cannot show the bug.
STARTS: dict[str, dict[str, Any]] = {
    "channel_blocks_1024": {},
    "second_level_4096": {},
    "dw_workspace_8192": {},
    "flat_index_fp32": {"op": "fwd", "dim": 4096, "seqlen": 8192, "batch": 1},
    "halo_off_by_one": {},
    "packed_boundary_leak": {},
    "dw_batch_unreduced": {},
    "final_state_straddle": {"seqlen": 8193, "seq_lens": (4096, 4097)},  # L mod tile 1
    "silu_derivative_wrong": {},
    "x_cast_to_weight_dtype": {"x_dtype": "float32", "w_dtype": "bfloat16"},
}


def _start(name: str) -> Any:
    bug = CATALOGUES["all"][name].bug
    return base_case({**bug.trigger, **MAMBA, **STARTS[name]})


def _shape(case: Any) -> str:
    parts = [f"L={case.seqlen}", f"C={case.dim}", f"B={case.batch}"]
    on = [
        name
        for name, value in (
            ("bias", case.bias),
            ("silu", case.activation),
            ("init", case.initial_state not in (None, "none")),
            ("final", case.final_state),
            ("packed", case.seq_lens),
            ("gap", case.gap),
            ("chlast", case.layout == "channel_last"),
        )
        if value
    ]
    dtype = "" if case.x_dtype == case.w_dtype == "float32" else f" {case.x_dtype}/{case.w_dtype}"
    return " ".join(parts) + (" +" + ",".join(on) if on else "") + dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bugs", default=",".join(STARTS))
    parser.add_argument("--max-runs", type=int, default=60)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print("| bug | case runs | seconds | from | to | boundaries |")
    print("|---|---|---|---|---|---|")
    for name in args.bugs.split(","):
        probe = Probe(RunOptions(kernel=f"seeded:{name}", device="cpu", reference_cache="off"))
        start = _start(name)
        began = time.perf_counter()
        result = shrink(start, probe, max_runs=args.max_runs)
        seconds = time.perf_counter() - began
        bounds = "; ".join(result.boundary_lines()) or "-"
        spent = " (budget spent)" if result.exhausted else ""
        row = {
            "bug": name, "runs": result.runs, "seconds": round(seconds, 1),
            "from": _shape(start), "to": _shape(result.case), "boundaries": bounds,
            "failed": result.failure.failed, "exhausted": result.exhausted,
        }  # fmt: skip
        rows.append(row)
        print(f"| {name} | {result.runs}{spent} | {seconds:.1f} | {row['from']} | "
              f"{row['to']} | {bounds} |", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
