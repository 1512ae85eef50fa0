"""Tiles of the MLU design: how a task's on-chip buffer is loaded from, and stored to, memory.

A task owns (batch, time tile, channel tile). Its buffer holds a window of positions
``[a, b)`` along time for ``C_t`` channels, in one of the seed's two tile shapes:

- time-contiguous input (``x.stride(2) == 1``): ``[C_t, n]``, a row of n tokens per channel;
- channel-contiguous input (``x.stride(1) == 1``): ``[n, C_t]``, channel vectors per token,
  the weights broadcast along time.

Here every task of one time tile is emulated at once: the buffer of a time tile is
``(B, nC, C_t, n)`` or ``(B, nC, n, C_t)`` (nC channel tiles; channels past C are masked lanes,
zero on load and never stored). Loads slice the caller's strided view directly: a window
position p reads ``x[..., p]`` for ``0 <= p < L``, the initial state for ``-(K-1) <= p < 0``
(the left halo of the first tile), and zero elsewhere (the tail of the last tile).
Position-indexed sources and destinations are given as ``(tensor, origin)`` pairs: element
``i`` of the tensor's last axis sits at position ``origin + i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Placed", "TilePlan", "Window", "plan_tiles"]

F32 = torch.float32

# A tensor whose last axis is a range of positions: (tensor, position of its element 0).
Placed = tuple[torch.Tensor, int]


@dataclass(frozen=True)
class Window:
    """A loaded window: ``logical`` is (B, C, n) over the real channels, ``tile`` the same
    FP32 storage in tile shape (B, nC, C_t, n) or (B, nC, n, C_t)."""

    logical: torch.Tensor
    tile: torch.Tensor


@dataclass(frozen=True)
class TilePlan:
    """Sizes of one call and its tile shape; all tile arithmetic goes through it."""

    batch: int
    dim: int
    seqlen: int
    width: int
    time_tile: int
    channel_tile: int
    time_major: bool
    device: torch.device

    @property
    def n_time_tiles(self) -> int:
        return -(-self.seqlen // self.time_tile)

    @property
    def n_channel_tiles(self) -> int:
        return -(-self.dim // self.channel_tile)

    @property
    def padded_dim(self) -> int:
        return self.n_channel_tiles * self.channel_tile

    @property
    def time_axis(self) -> int:
        return -1 if self.time_major else -2

    # -- shapes ----------------------------------------------------------------------------
    def per_channel(self, values: torch.Tensor) -> torch.Tensor:
        """(padded_dim,) → broadcastable against a tile: (nC, C_t, 1) or (nC, 1, C_t)."""
        nc, ct = self.n_channel_tiles, self.channel_tile
        return values.view(nc, ct, 1) if self.time_major else values.view(nc, 1, ct)

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """(B, n) → broadcastable against a tile: (B, 1, 1, n) or (B, 1, n, 1)."""
        b, n = values.shape
        return values.view(b, 1, 1, n) if self.time_major else values.view(b, 1, n, 1)

    def narrow(self, tile: torch.Tensor, start: int, length: int) -> torch.Tensor:
        """The shifted view ``tile[..., start:start+length]`` along time."""
        return tile.narrow(self.time_axis, start, length)

    def pad_left(self, tile: torch.Tensor, count: int) -> torch.Tensor:
        """Prepend ``count`` zero positions along time."""
        return F.pad(tile, (count, 0) if self.time_major else (0, 0, count, 0))

    def sum_time(self, tile: torch.Tensor) -> torch.Tensor:
        """Reduce a tile over time → (B, padded_dim)."""
        return tile.sum(self.time_axis).reshape(self.batch, self.padded_dim)

    def logical(self, tile: torch.Tensor) -> torch.Tensor:
        """Tile → (B, C, n) over the real channels (a view when the tile is fresh)."""
        n = tile.shape[self.time_axis]
        if self.time_major:
            flat = tile.reshape(self.batch, self.padded_dim, n)
        else:
            flat = tile.permute(0, 2, 1, 3).reshape(self.batch, n, self.padded_dim)
            flat = flat.transpose(1, 2)
        return flat[:, : self.dim]

    def pad_channels(self, values: torch.Tensor) -> torch.Tensor:
        """(C, ...) FP32 copy padded with zero lanes to (padded_dim, ...)."""
        out = values.new_zeros((self.padded_dim, *values.shape[1:]), dtype=F32)
        out[: self.dim] = values
        return out

    # -- memory traffic ----------------------------------------------------------------------
    def load(self, parts: Sequence[Placed], start: int, stop: int) -> Window:
        """Load positions ``[start, stop)`` from every source that covers them, into FP32."""
        n = stop - start
        if self.time_major:
            buf = torch.zeros(self.batch, self.padded_dim, n, dtype=F32, device=self.device)
            logical = buf[:, : self.dim]
            tile = buf.view(self.batch, self.n_channel_tiles, self.channel_tile, n)
        else:
            buf = torch.zeros(self.batch, n, self.padded_dim, dtype=F32, device=self.device)
            logical = buf.transpose(1, 2)[:, : self.dim]
            tile = buf.view(self.batch, n, self.n_channel_tiles, self.channel_tile)
            tile = tile.permute(0, 2, 1, 3)
        for src, origin in parts:
            lo, hi = max(start, origin), min(stop, origin + src.shape[-1])
            if hi > lo:
                logical[..., lo - start : hi - start] = src[..., lo - origin : hi - origin]
        return Window(logical, tile)

    def store(self, tile: torch.Tensor, start: int, parts: Sequence[Placed]) -> None:
        """Store a tile covering positions ``[start, start+n)`` into each destination's range
        (casting to the destination's dtype, the only rounding of an output)."""
        values = self.logical(tile)
        stop = start + values.shape[-1]
        for dst, origin in parts:
            lo, hi = max(start, origin), min(stop, origin + dst.shape[-1])
            if hi > lo:
                dst[..., lo - origin : hi - origin] = values[..., lo - start : hi - start]

    def empty_output(self, dtype: torch.dtype) -> torch.Tensor:
        """A (B, C, L) output in the input's layout (channel-contiguous stays channel-last)."""
        if self.time_major:
            return torch.empty(self.batch, self.dim, self.seqlen, dtype=dtype, device=self.device)
        out = torch.empty(self.batch, self.seqlen, self.dim, dtype=dtype, device=self.device)
        return out.transpose(1, 2)


def token_window(values: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``values[..., start:stop]`` of a per-token tensor (..., L), zero outside [0, L)."""
    seqlen = values.shape[-1]
    lo, hi = max(start, 0), min(stop, seqlen)
    out = values.new_zeros((*values.shape[:-1], stop - start))
    if hi > lo:
        out[..., lo - start : hi - start] = values[..., lo:hi]
    return out


def plan_tiles(x: torch.Tensor, width: int, time_tile: int, channel_tile: int) -> TilePlan:
    """The tile plan of one call; the tile shape follows the input's layout.

    Channel-contiguous (``stride(1) == 1`` and ``stride(2) != 1``) gets ``[T, C_t]`` tiles;
    everything else, including general strided views, gets ``[C_t, T]`` rows.
    """
    batch, dim, seqlen = x.shape
    time_major = not (x.stride(1) == 1 and x.stride(2) != 1)
    return TilePlan(batch, dim, seqlen, width, time_tile, channel_tile, time_major, x.device)
