"""``convmatrix plan``: rank feasible tiles for an on-chip budget, every buffer spelled out.

    convmatrix plan --budget 262144 --width 4 --dtype bfloat16/float32 --dim 4096 [--double-buffer]

Forward and backward are ranked separately (the backward needs larger buffers, seed ch. 8);
the off-chip dw/db workspace of P partial groups is printed once. See
``convmatrix.kernels.builtin.planner`` for the formulas.
"""

from __future__ import annotations

import argparse

from convmatrix.core.dtypes import ITEMSIZE, parse_dtype_pair
from convmatrix.core.errors import UsageError
from convmatrix.kernels.builtin.planner import TileCost, rank_tiles, workspace_bytes

__all__ = ["add_arguments", "plan_command", "render_plan"]


def _table(costs: list[TileCost], top: int) -> list[str]:
    if not costs:
        return ["  no feasible tile: every candidate exceeds the budget"]
    names = [b.name for b in costs[0].buffers]
    head = f"  {'rank':>4} {'T':>5} {'C_t':>5} {'halo':>7} {'B/out':>7} {'lanes':>6}"
    head += "".join(f" {n:>9}" for n in names) + f" {'total':>9}"
    lines = [head]
    for rank, cost in enumerate(costs[:top], 1):
        row = (
            f"  {rank:>4} {cost.time_tile:>5} {cost.channel_tile:>5} {cost.halo_ratio:>7.4f}"
            f" {cost.bytes_per_output:>7.3f} {cost.lane_use:>6.1%}"
        )
        row += "".join(f" {b.bytes:>9}" for b in cost.buffers) + f" {cost.total:>9}"
        lines.append(row)
    formulas = ", ".join(f"{b.name} = {b.formula}" for b in costs[0].buffers)
    lines.append(f"  bytes per buffer: {formulas}")
    if len(costs) > top:
        lines.append(f"  ... {len(costs) - top} more feasible tiles (--top N to show more)")
    return lines


def render_plan(
    budget: int,
    width: int,
    dtype: str,
    dim: int,
    *,
    double_buffer: bool = False,
    vec: int = 8,
    partial_groups: int = 4,
    silu: bool = True,
    top: int = 10,
) -> str:
    x_dtype, w_dtype = parse_dtype_pair(dtype)
    s_x, s_w = ITEMSIZE[x_dtype], ITEMSIZE[w_dtype]
    mode = "double buffer" if double_buffer else "single buffer"
    lines = [
        f"budget {budget} bytes, K={width}, x {x_dtype} (s_x={s_x}), w {w_dtype} (s_w={s_w}), "
        f"C={dim}, vec={vec}, {mode}; ranked by halo (K-1)/T, bytes moved per output "
        "element, lane use of the channel tiles",
        f"dw/db workspace (off-chip FP32, P={partial_groups}): 4*P*C*(K+1) = "
        f"4*{partial_groups}*{dim}*{width + 1} = {workspace_bytes(partial_groups, dim, width)}",
    ]
    common = dict(double_buffer=double_buffer, vec=vec, silu=silu)
    for direction in ("forward", "backward"):
        costs = rank_tiles(direction, budget, width, x_dtype, w_dtype, dim, **common)
        extra = (
            " (SiLU: z recomputed on the right halo)" if direction == "backward" and silu else ""
        )
        lines.append(f"{direction}{extra}: {len(costs)} feasible tiles")
        lines.extend(_table(costs, top))
    return "\n".join(lines)


def plan_command(args: argparse.Namespace) -> int:
    for name in ("budget", "width", "dim", "vec", "partial_groups", "top"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be a positive integer, got {getattr(args, name)}")
    print(
        render_plan(
            args.budget,
            args.width,
            args.dtype,
            args.dim,
            double_buffer=args.double_buffer,
            vec=args.vec,
            partial_groups=args.partial_groups,
            silu=args.activation == "silu",
            top=args.top,
        )
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=int, required=True, help="on-chip bytes per task")
    parser.add_argument("--width", type=int, required=True, help="kernel width K")
    parser.add_argument("--dtype", required=True, help="X or X/W, e.g. bfloat16/float32")
    parser.add_argument("--dim", type=int, required=True, help="channels C")
    parser.add_argument("--double-buffer", action="store_true", help="prefetch next tile")
    parser.add_argument("--vec", type=int, default=8, help="vector width; C_t is a multiple")
    parser.add_argument("--partial-groups", type=int, default=4, help="P for the workspace")
    parser.add_argument("--activation", choices=("silu", "none"), default="silu")
    parser.add_argument("--top", type=int, default=10, help="rows per table")
    parser.set_defaults(handler=plan_command)
