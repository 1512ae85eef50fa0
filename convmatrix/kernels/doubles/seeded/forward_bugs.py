"""Seeded bugs of the forward: what the tile loop reads (weights, strides, sequence ids, the
state) and what it stores (tails, channel lanes, the final state). Each class is ``tiled``
with one hook overridden; its docstring says what a real kernel got wrong."""

from __future__ import annotations

import torch

from convmatrix.kernels.doubles.seeded.base import Bug, Call, SeededKernel

__all__ = ["FORWARD_BUGS"]

Pair = tuple[torch.Tensor, torch.Tensor]


def dense_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """The strides ``x`` would have if it were a dense tensor of its layout (no gaps)."""
    _batch, dim, seqlen = x.shape
    if x.stride(1) == 1 and x.stride(2) != 1:  # channel-contiguous
        return (seqlen * dim, 1, dim)
    return (dim * seqlen, seqlen, 1)


def _round_through(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype).to(t.dtype)


class TapsReversed(SeededKernel):
    """Weight taps applied in reverse: ``weight[c, K-1]`` multiplies the oldest token
    (docs/spec.md §2 fixes the direction; a port from cross-correlation gets it backwards)."""

    bug = Bug("taps_reversed", "weight direction", "width K", "seed table", {}, None, "any case")

    def mutate_inputs(self, call: Call) -> Call:
        return call.replace(weight=call.weight.flip(-1))


class HaloOffByOne(SeededKernel):
    """The left halo of every time tile after the first is loaded one position short: the
    first token of tile j (j >= 1) reads 0 for its oldest tap instead of ``x[jT-(K-1)]``."""

    bug = Bug(
        "halo_off_by_one", "halo", "length L", "seed table",
        {"seqlen": 65}, {"seqlen": 64}, "seqlen > tile (tile+1)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        tile, halo, seqlen = self.geometry.time_tile, call.weight.shape[1] - 1, call.x.shape[2]
        starts = list(range(tile, seqlen, tile))
        if not starts or halo == 0:
            return y, final
        short = call.x.clone()
        for t0 in starts:
            short[..., t0 - halo] = 0
        wrong = self.forward_of(call.replace(x=short))[0]
        for t0 in starts:
            y[..., t0] = wrong[..., t0]
        return y, final


class TailTileDropped(SeededKernel):
    """The number of time tiles is ``L // T`` (rounded down): the partial last tile is never run and
    its outputs stay as allocated (zero here)."""

    bug = Bug(
        "tail_tile_dropped", "tail blocks", "length L", "seed table",
        {"seqlen": 8}, {"seqlen": 64}, "seqlen not a multiple of tile",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        tile = self.geometry.time_tile
        y[..., (y.shape[2] // tile) * tile :] = 0
        return y, final


class VecTailDropped(SeededKernel):
    """No lane mask for the last, partial channel vector: the kernel runs ``C // vec`` whole
    vectors and the ``C % vec`` channels after them are never computed."""

    bug = Bug(
        "vec_tail_dropped", "channel mask", "channels C", "seed table",
        {"dim": 9}, {"dim": 8}, "dim not a multiple of vec (vec+1)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        vec = self.geometry.vector_width or 1
        y[:, (y.shape[1] // vec) * vec :] = 0
        return y, final


class ChannelTileTailDropped(SeededKernel):
    """The grid covers ``C // C_t`` channel tiles (rounded down): channels past the last whole
    channel tile are never computed (Dao #32's sibling: grid arithmetic off at the edge)."""

    bug = Bug(
        "ctile_tail_dropped", "channel mask", "channels C", "seed table",
        {"dim": 33}, {"dim": 32}, "dim not a multiple of ctile (ctile+1)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        ctile = self.geometry.channel_tile
        y[:, (y.shape[1] // ctile) * ctile :] = 0
        return y, final


class ShapeAsStride(SeededKernel):
    """Strides computed from the shape: x is addressed as a dense tensor of its layout, which
    is right until x is a gapped view (Mamba2's channel slice, padded rows or batches)."""

    bug = Bug(
        "shape_as_stride", "shape used as stride", "layout", "seed table",
        {"gap": "row_pad"}, {}, "gap (row_pad, channel_slice with batch > 1, batch_pad)",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        x = call.x
        return call.replace(x=x.as_strided(x.shape, dense_strides(x), x.storage_offset()))


class ChannelLastStrides(SeededKernel):
    """The channel-last path reads x with channel-first strides ``(C*L, L, 1)``."""

    bug = Bug(
        "channel_last_strides", "layout stride mix-up", "layout", "seed table",
        {"layout": "channel_last"}, {}, "layout channel_last",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        x = call.x
        if not (x.stride(1) == 1 and x.stride(2) != 1):
            return call
        _batch, dim, seqlen = x.shape
        return call.replace(x=x.as_strided(x.shape, (dim * seqlen, seqlen, 1), x.storage_offset()))


class InitialStateReversed(SeededKernel):
    """The initial state is read newest first (docs/spec.md §2: oldest first)."""

    bug = Bug(
        "initial_state_reversed", "state order", "state", "seed table",
        {"initial_state": "random"}, {}, "initial_state random with width >= 3",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        s0 = call.initial_state
        return call if s0 is None else call.replace(initial_state=s0.flip(-1))


class FinalStateShortChunk(SeededKernel):
    """The final state is always the last K-1 positions of x (zero-padded): for L < K-1 the
    part that must come from the initial state is lost (the "short chunk")."""

    bug = Bug(
        "final_state_short_chunk", "final state from the wrong end", "state", "seed table",
        {"seqlen": 2, "initial_state": "random", "final_state": True},
        {"seqlen": 8, "initial_state": "random", "final_state": True},
        "seqlen < K-1 with a random initial state and final_state",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        halo, seqlen = final.shape[2], call.x.shape[2]
        if seqlen >= halo:
            return y, final
        zeros = final.new_zeros(*final.shape[:2], halo - seqlen)
        return y, torch.cat([zeros, call.x.to(final.dtype)], dim=2)


class FinalStateStale(SeededKernel):
    """fla-org/flash-linear-attention commit 95a89a9: the conv cache was not updated after the
    prompt; the returned final state is the incoming state unchanged (zeros without one)."""

    bug = Bug(
        "final_state_stale", "stale state", "state", "fla 95a89a9",
        {"final_state": True}, {}, "final_state true",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        s0 = call.initial_state
        return y, torch.zeros_like(final) if s0 is None else s0.to(final.dtype).clone()


class BiasAfterSilu(SeededKernel):
    """Bias added after the activation: ``silu(z - b) + b`` instead of ``silu(z)``."""

    bug = Bug(
        "bias_after_silu", "bias order", "activation", "seed table",
        {"activation": "silu"}, {"activation": None}, "activation silu with bias",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        if not call.silu or call.bias is None:
            return y, final
        unbiased = self.forward_of(call.replace(bias=None))[0]
        return (unbiased.float() + call.bias.float()[:, None]).to(y.dtype), final


class ActivationDropped(SeededKernel):
    """state-spaces/mamba commit 2066c21 (PR #168): after causal-conv1d 1.1.0 inserted
    ``seq_idx`` before ``activation``, a positional ``"silu"`` landed in the wrong parameter;
    with a tolerant wrapper the activation is silently dropped."""

    bug = Bug(
        "activation_dropped", "activation dropped", "activation", "mamba 2066c21",
        {"activation": "silu"}, {}, "activation silu",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        return call.replace(silu=False)


class OutputTailSlice(SeededKernel):
    """state-spaces/mamba PR #580 (commit 6b72c12) and a71bb5a: the non-fused fallback sliced
    ``conv1d(pad(x, K-1, K-1))`` at its tail instead of its head, so y[t] reads x[t..t+K-1]
    (future tokens) and ignores the initial state."""

    bug = Bug(
        "output_tail_slice", "output alignment", "width K", "mamba #580", {}, None, "any case",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        halo = call.weight.shape[1] - 1
        if halo == 0 or call.seq_idx is not None:
            return y, final
        ahead = torch.cat([call.x, call.x.new_zeros(*call.x.shape[:2], halo)], dim=2)
        shifted = self.forward_of(call.replace(x=ahead, initial_state=None))[0]
        return shifted[..., halo:].contiguous(), final


class PackedBoundaryLeak(SeededKernel):
    """Taps are not masked at packed-sequence boundaries: the next sequence's first tokens
    read the previous sequence's last ones (padding is still honoured)."""

    bug = Bug(
        "packed_boundary_leak", "cross-sample contamination", "packed", "seed table",
        {"seq_lens": (4, 4)}, {}, "packed with two live sequences",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        ids = call.seq_idx
        if ids is None:
            return call
        return call.replace(seq_idx=torch.where(ids >= 0, torch.zeros_like(ids), ids))


def unpadded(ids: torch.Tensor) -> torch.Tensor:
    """Sequence ids with padding tokens (negative) turned into one more live sequence."""
    return torch.where(ids < 0, ids.max() + 1, ids)


class PaddingOutputs(SeededKernel):
    """Padding tokens (seq_idx -1) produce output instead of 0 (sgl-project/sgl-kernel-npu
    PR #742 zeroes "physical varlen tail rows" its previous kernel left non-zero)."""

    bug = Bug(
        "padding_outputs", "padding tokens produce output", "packed", "sgl-kernel-npu #742",
        {"seq_lens": (6, -2)}, {"seq_lens": (4, 4)}, "packed with padding (pad > 0)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        if call.seq_idx is None or not bool((call.seq_idx < 0).any()):
            return y, final
        live_pad = self.forward_of(call.replace(seq_idx=unpadded(call.seq_idx)))[0]
        pad = (call.seq_idx < 0)[:, None, :].expand_as(y)
        return torch.where(pad, live_pad, y), final


class InitialStateEverySequence(SeededKernel):
    """vllm-project/vllm-ascend PR #10558 (review finding): the initial state is applied to
    every packed sequence, not only to the row's first one (``has_initial_state`` ignored)."""

    bug = Bug(
        "initial_state_every_sequence", "state applied per sequence", "packed",
        "vllm-ascend #10558",
        {"seq_lens": (4, 4), "initial_state": "random"}, {"seq_lens": (4, 4)},
        "packed with a random initial state",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        ids = call.seq_idx
        if ids is None or call.initial_state is None:
            return y, final
        row = ids[0].tolist()
        starts = [t for t in range(1, len(row)) if row[t] != row[t - 1] and row[t] >= 0]
        for start in starts:
            stop = next((t for t in range(start, len(row)) if row[t] != row[start]), len(row))
            part = call.replace(x=call.x[..., start:stop], seq_idx=None)
            y[..., start:stop] = self.forward_of(part)[0]
        return y, final


class HalfProducts(SeededKernel):
    """vllm-project/vllm #52887: the products are formed in half precision before the FP32
    accumulation (here: x, weight and state rounded to fp16 before the multiply)."""

    bug = Bug(
        "half_products", "half-precision products", "parameters", "vllm #52887",
        {}, {"x_dtype": "float16", "w_dtype": "float16"}, "float32 x and weight",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        half = torch.float16
        return call.replace(
            x=_round_through(call.x, half),
            weight=_round_through(call.weight, half),
            initial_state=_round_through(call.initial_state, half),
        )


class XCastToWeightDtype(SeededKernel):
    """A mixed-dtype path casts x and the state to the weight dtype before the loop (right
    when weights are the wider type, lossy when x is wider than the weights)."""

    bug = Bug(
        "x_cast_to_weight_dtype", "mixed-dtype dispatch", "parameters", "seed table",
        {"x_dtype": "float32", "w_dtype": "bfloat16"},
        {"x_dtype": "bfloat16", "w_dtype": "float32"},
        "x dtype wider than the weight dtype (float32/bfloat16)",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        wdt = call.weight.dtype
        if call.x.dtype == wdt:
            return call
        return call.replace(
            x=_round_through(call.x, wdt),  # values through the weight dtype, x's own dtype kept
            initial_state=_round_through(call.initial_state, wdt),
        )


class DaoWeightGuard(SeededKernel):
    """Dao-AILab/causal-conv1d commit bdf4d38 ("Fix weight loading for dim <= 64"): the
    channel-last forward loaded weights under ``chunk_c_id + kChunkSizeC + row_idx < dim``
    (``+`` for ``*``); channels failing the wrong guard keep weight 0."""

    bug = Bug(
        "dao_weight_guard", "channel-chunk guard", "channels C", "Dao bdf4d38",
        {"layout": "channel_last"}, {}, "channel_last with dim <= 2 * 128 / itemsize",
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        x = call.x
        if not (x.stride(1) == 1 and x.stride(2) != 1):
            return call
        chunk, dim = 128 // x.element_size(), x.shape[1]
        c = torch.arange(dim, device=x.device)
        weight = call.weight.clone()
        weight[(c // chunk) + chunk + (c % chunk) >= dim] = 0
        return call.replace(weight=weight)


class FinalStateSmemOob(SeededKernel):
    """vllm-project/vllm PR #9838: the final state was read from ``smem_exchange[last_thread
    + 1]``, out of range when ``L-(K-1)`` lands in the last vector of a chunk (an illegal
    memory access; here an IndexError)."""

    bug = Bug(
        "final_state_smem_oob", "shared-memory over-read", "length L", "vllm #9838",
        {"seqlen": 64, "final_state": True}, {"seqlen": 64},
        "final_state with (L-(K-1)) mod tile >= tile-vec (L = tile, tile-1)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        tile, vec = self.geometry.time_tile, self.geometry.vector_width or 1
        last = call.x.shape[2] - final.shape[2]
        if call.final_requested and last >= 0 and last % tile >= tile - vec:
            raise IndexError(f"final state read past the exchange buffer (L-(K-1)={last})")
        return y, final


class FinalStateStraddle(SeededKernel):
    """vllm-project/vllm #10895 / PR #10928 (silent form): when the final-state window
    straddles the last two time tiles, its columns from the earlier tile are taken one tile
    too early."""

    bug = Bug(
        "final_state_straddle", "final state across tiles", "length L", "vllm #10928",
        {"seqlen": 129, "final_state": True}, {"seqlen": 128, "final_state": True},
        "final_state with L mod tile in [1, K-2] (tile+1, K >= 3)",
    )  # fmt: skip

    def mutate_outputs(self, call: Call, y: torch.Tensor, final: torch.Tensor) -> Pair:
        tile, seqlen = self.geometry.time_tile, call.x.shape[2]
        first = seqlen - final.shape[2]
        last_tile = ((seqlen - 1) // tile) * tile
        if seqlen <= tile or first < 0 or first >= last_tile:
            return y, final
        final = final.clone()
        for i in range(last_tile - first):
            final[..., i] = call.x[..., max(first + i - tile, 0)]
        return y, final


FORWARD_BUGS: tuple[type[SeededKernel], ...] = (
    TapsReversed,
    HaloOffByOne,
    TailTileDropped,
    VecTailDropped,
    ChannelTileTailDropped,
    ShapeAsStride,
    ChannelLastStrides,
    InitialStateReversed,
    FinalStateShortChunk,
    FinalStateStale,
    BiasAfterSilu,
    ActivationDropped,
    OutputTailSlice,
    PackedBoundaryLeak,
    PaddingOutputs,
    InitialStateEverySequence,
    HalfProducts,
    XCastToWeightDtype,
    DaoWeightGuard,
    FinalStateSmemOob,
    FinalStateStraddle,
)
