"""Tile planner: the seed's capacity formulas (docs/spec.md §5) for candidate tiles (T, C_t).

Forward, single buffer, low-precision input, FP32 accumulation (seed, chapter 8):
``M ~ (T+K-1)*C_t*s_x + T*C_t*4 + K*C_t*s_w + M_extra``. M_extra is spelled out here as the
bias (``C_t*s_w``) and the converted output tile being stored (``T*C_t*s_x``).

Backward with SiLU needs an input buffer of ``(T+2K-2)*C_t`` (z is recomputed on the right
halo), an upstream-gradient buffer of ``(T+K-1)*C_t`` and FP32 partials: dz on ``T+K-1``
tokens, the owned dx (``T+K-1`` positions for the first tile, which also owns dS) and the
``K+1`` parameter partial sums per channel. Without SiLU z is not recomputed and the input
buffer is ``(T+K-1)*C_t``.

Double buffering is added item by item, never by doubling the total: the streamed buffers
(input, upstream gradient, output tile) get a second copy; accumulators, weights and bias
do not. The off-chip parameter-gradient workspace of P partial groups is ``4*P*C*(K+1)``.

Feasible tiles are ranked by halo ratio ``(K-1)/T`` (re-read inputs), then by bytes moved
per output element (tile loads and stores over ``T*C_t``), then by lane use of the last
channel tile (``C / (nC*C_t)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from convmatrix.core.contract import Geometry
from convmatrix.core.dtypes import ITEMSIZE, parse_dtype_pair
from convmatrix.core.errors import UsageError

__all__ = [
    "Buffer",
    "TileCost",
    "backward_buffers",
    "forward_buffers",
    "geometry_for_budget",
    "rank_tiles",
    "workspace_bytes",
]

TIME_TILES = tuple(2**i for i in range(3, 14))  # 8 .. 8192


@dataclass(frozen=True)
class Buffer:
    name: str
    formula: str
    bytes: int


@dataclass(frozen=True)
class TileCost:
    """One candidate tile of one pass with every buffer's bytes."""

    direction: str  # "forward" | "backward"
    time_tile: int
    channel_tile: int
    buffers: tuple[Buffer, ...]
    halo_ratio: float
    bytes_per_output: float
    lane_use: float

    @property
    def total(self) -> int:
        return sum(b.bytes for b in self.buffers)


def _buffer(name: str, formula: str, elements: int, size: int, copies: int = 1) -> Buffer:
    if copies > 1:
        formula = f"{copies}*{formula}"
    return Buffer(name, formula, copies * elements * size)


def forward_buffers(
    time_tile: int, channel_tile: int, width: int, s_x: int, s_w: int, double_buffer: bool
) -> tuple[Buffer, ...]:
    t, c, k = time_tile, channel_tile, width
    n = 2 if double_buffer else 1
    return (
        _buffer("input", "(T+K-1)*C_t*s_x", (t + k - 1) * c, s_x, n),
        _buffer("acc", "T*C_t*4", t * c, 4),
        _buffer("weight", "K*C_t*s_w", k * c, s_w),
        _buffer("bias", "C_t*s_w", c, s_w),
        _buffer("out", "T*C_t*s_x", t * c, s_x, n),
    )


def backward_buffers(
    time_tile: int,
    channel_tile: int,
    width: int,
    s_x: int,
    s_w: int,
    double_buffer: bool,
    silu: bool = True,
) -> tuple[Buffer, ...]:
    t, c, k = time_tile, channel_tile, width
    n = 2 if double_buffer else 1
    if silu:
        inputs = _buffer("input", "(T+2K-2)*C_t*s_x", (t + 2 * k - 2) * c, s_x, n)
    else:
        inputs = _buffer("input", "(T+K-1)*C_t*s_x", (t + k - 1) * c, s_x, n)
    return (
        inputs,
        _buffer("dy", "(T+K-1)*C_t*s_x", (t + k - 1) * c, s_x, n),
        _buffer("dz", "(T+K-1)*C_t*4", (t + k - 1) * c, 4),
        _buffer("dx_acc", "(T+K-1)*C_t*4", (t + k - 1) * c, 4),
        _buffer("partials", "(K+1)*C_t*4", (k + 1) * c, 4),
        _buffer("weight", "K*C_t*s_w", k * c, s_w),
        _buffer("bias", "C_t*s_w", c, s_w),
        _buffer("dx_out", "(T+K-1)*C_t*s_x", (t + k - 1) * c, s_x, n),
    )


def workspace_bytes(partial_groups: int, dim: int, width: int) -> int:
    """Off-chip FP32 dw/db workspace: P groups x C channels x (K taps + bias)."""
    return 4 * partial_groups * dim * (width + 1)


def _traffic(direction: str, t: int, c: int, k: int, s_x: int, s_w: int, silu: bool) -> int:
    """Bytes one task moves between memory and its buffers (weights included)."""
    params = (k + 1) * c * s_w
    if direction == "forward":
        return (t + k - 1) * c * s_x + t * c * s_x + params
    inputs = (t + 2 * k - 2) if silu else (t + k - 1)
    return inputs * c * s_x + (t + k - 1) * c * s_x + t * c * s_x + params + (k + 1) * c * 4


def _channel_tiles(dim: int, vec: int) -> list[int]:
    """Multiples of vec doubling up to the first that covers ``dim`` (capped at 1024)."""
    tiles, c = [], vec
    while True:
        tiles.append(c)
        if c >= dim or c * 2 > max(1024, vec):
            return tiles
        c *= 2


def rank_tiles(
    direction: str,
    budget: int,
    width: int,
    x_dtype: str,
    w_dtype: str,
    dim: int,
    *,
    double_buffer: bool = False,
    vec: int = 8,
    silu: bool = True,
) -> list[TileCost]:
    """Feasible (total <= budget) tiles of one pass, best first."""
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be forward or backward, got {direction!r}")
    s_x, s_w = ITEMSIZE[x_dtype], ITEMSIZE[w_dtype]
    found = []
    for c in _channel_tiles(dim, vec):
        n_ctiles = -(-dim // c)
        for t in TIME_TILES:
            if direction == "forward":
                buffers = forward_buffers(t, c, width, s_x, s_w, double_buffer)
            else:
                buffers = backward_buffers(t, c, width, s_x, s_w, double_buffer, silu)
            cost = TileCost(
                direction,
                t,
                c,
                buffers,
                halo_ratio=(width - 1) / t,
                bytes_per_output=_traffic(direction, t, c, width, s_x, s_w, silu) / (t * c),
                lane_use=dim / (n_ctiles * c),
            )
            if cost.total <= budget:
                found.append(cost)
    found.sort(key=lambda s: (s.halo_ratio, s.bytes_per_output, -s.lane_use, -s.channel_tile))
    return found


def geometry_for_budget(
    budget: int,
    width: int = 4,
    dtype: str = "float32/float32",
    dim: int = 4096,
    double_buffer: bool = False,
    vec: int = 8,
    partial_groups: int = 4,
) -> Geometry:
    """The best tile that fits the budget in both passes (the kernel uses one geometry for
    forward and backward, so the backward's larger buffers decide)."""
    x_dtype, w_dtype = parse_dtype_pair(dtype)
    forward = {
        (c.time_tile, c.channel_tile)
        for c in rank_tiles(
            "forward", budget, width, x_dtype, w_dtype, dim, double_buffer=double_buffer, vec=vec
        )
    }
    for cost in rank_tiles(
        "backward", budget, width, x_dtype, w_dtype, dim, double_buffer=double_buffer, vec=vec
    ):
        if (cost.time_tile, cost.channel_tile) in forward:
            return Geometry(cost.time_tile, cost.channel_tile, vec, partial_groups)
    raise UsageError(
        f"no tile (T >= {TIME_TILES[0]}, C_t >= {vec}) fits {budget} bytes for K={width}, "
        f"{x_dtype}/{w_dtype}"
    )
