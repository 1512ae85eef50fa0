"""Seeded bugs of the backward: what it reads (dy, dF), SiLU's derivative, and the two-stage
reduction of dw and db over batch rows, time tiles and partial groups."""

from __future__ import annotations

import torch

from convmatrix.kernels.builtin.tiled.backward import Gradients
from convmatrix.kernels.doubles.seeded.base import Bug, Call, SeededKernel
from convmatrix.kernels.doubles.seeded.forward_bugs import unpadded

__all__ = ["BACKWARD_BUGS", "masked", "params_from"]

GradPair = tuple[torch.Tensor, torch.Tensor | None]


def params_from(grads: Gradients, other: Gradients) -> Gradients:
    """dx and dS of ``grads``, dw and db of ``other``."""
    return grads[0], other[1], other[2], grads[3]


def masked(grad: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``grad`` with the (B, L) positions where ``keep`` is false zeroed."""
    return grad * keep[:, None, :].to(grad.device, grad.dtype)


class DfIgnored(SeededKernel):
    """The gradient of the final state (dF) is never read: dx and dS miss its pass-through."""

    bug = Bug(
        "dF_ignored", "direct state gradient", "state", "seed table",
        {"final_state": True, "dfinal": "random"}, {"final_state": True, "dfinal": "zero"},
        "final_state with dfinal random",
    )  # fmt: skip

    def mutate_grad_inputs(self, call: Call, grad_y, grad_final) -> GradPair:  # type: ignore[no-untyped-def]
        return grad_y, None


class SiluDerivativeWrong(SeededKernel):
    """SiLU's derivative taken as ``sigmoid(z)``, dropping ``z * s * (1 - s)``."""

    bug = Bug(
        "silu_derivative_wrong", "activation derivative", "activation", "seed table",
        {"activation": "silu"}, {}, "activation silu (backward)",
    )  # fmt: skip

    silu_grad = staticmethod(torch.sigmoid)


class DwBatchUnreduced(SeededKernel):
    """dw and db are not reduced across the batch: only row 0's contribution is kept."""

    bug = Bug(
        "dw_batch_unreduced", "global reduction", "batch B", "seed table",
        {"batch": 2}, {"seqlen": 129}, "batch > 1 (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        if grad_y.shape[0] == 1:
            return grads
        keep = torch.zeros(grad_y.shape[0], grad_y.shape[2], dtype=torch.bool)
        keep[0] = True
        return params_from(grads, self.backward_of(call, masked(grad_y, keep), None))


class DwGroupsUnreduced(SeededKernel):
    """The second stage of the dw/db reduction reads partial group 0 only: tasks that went to
    the other P-1 groups are lost (needs more than one (batch, time tile) task)."""

    bug = Bug(
        "dw_groups_unreduced", "partial-group reduction", "length L", "seed table",
        {"seqlen": 129}, {}, "batch x time tiles > 1 (seqlen > tile or batch > 1)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        tile, groups = self.geometry.time_tile, self.geometry.partial_groups or 1
        batch, _, seqlen = grad_y.shape
        n_tiles = -(-seqlen // tile)
        keep = torch.zeros(batch, seqlen, dtype=torch.bool)
        for b in range(batch):
            for j in range(n_tiles):
                if (b * n_tiles + j) % groups == 0:
                    keep[b, j * tile : (j + 1) * tile] = True
        if bool(keep.all()):
            return grads
        return params_from(grads, self.backward_of(call, masked(grad_y, keep), None))


class DwTilesUnreduced(SeededKernel):
    """The dw/db accumulator is reset per time tile and only the first tile's partial is
    stored: tokens past the first tile add nothing."""

    bug = Bug(
        "dw_tiles_unreduced", "tile reduction", "length L", "seed table",
        {"seqlen": 65}, {"batch": 2}, "seqlen > tile (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        tile, seqlen = self.geometry.time_tile, grad_y.shape[2]
        if seqlen <= tile:
            return grads
        keep = torch.zeros(grad_y.shape[0], seqlen, dtype=torch.bool)
        keep[:, :tile] = True
        return params_from(grads, self.backward_of(call, masked(grad_y, keep), None))


class DwInitWithoutFinal(SeededKernel):
    """fla-org/flash-linear-attention PR #714 (commit fdeba1b): the backward's "no state"
    branch was chosen by ``not USE_FINAL_STATE``, so an initial state without a requested
    final state lost its dw terms and its gradient dS."""

    bug = Bug(
        "dw_init_without_final", "state gradient branch", "state", "fla #714",
        {"initial_state": "random"}, {"initial_state": "random", "final_state": True},
        "random initial_state with final_state false (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        s0 = call.initial_state
        if s0 is None or call.final_requested:
            return grads
        stateless = self.backward_of(call.replace(initial_state=torch.zeros_like(s0)), grad_y, None)
        return grads[0], stateless[1], stateless[2], torch.zeros_like(s0)


class DwInitSeqlen1(SeededKernel):
    """fla-org/flash-linear-attention PR #1146: for T = 1 the masked reduce dropped the
    initial state's contribution to dw (columns 0..K-2 wrong, column K-1 right)."""

    bug = Bug(
        "dw_init_seqlen1", "degenerate tile", "length L", "fla #1146",
        {"seqlen": 1, "initial_state": "random"}, {"seqlen": 2, "initial_state": "random"},
        "seqlen 1 with a random initial state (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        s0 = call.initial_state
        if s0 is None or grad_y.shape[2] != 1:
            return grads
        stateless = self.backward_of(call.replace(initial_state=torch.zeros_like(s0)), grad_y, None)
        return grads[0], stateless[1], grads[2], grads[3]


class DsShortChunkPassthrough(SeededKernel):
    """fla-org/flash-linear-attention #1140 / PR #1141 (commit a252c17): for L < K-1 the
    initial-state slots that survive into the final state did not get dF (dS misses q)."""

    bug = Bug(
        "dS_short_chunk_passthrough", "short-chunk state gradient", "state", "fla #1140",
        {"seqlen": 1, "initial_state": "random", "final_state": True, "dfinal": "random"},
        {"seqlen": 8, "initial_state": "random", "final_state": True, "dfinal": "random"},
        "seqlen < K-1, random initial_state, final_state, dfinal random",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        dx, dw, db, ds = grads
        seqlen = grad_y.shape[2]
        if ds is None or grad_final is None or seqlen >= ds.shape[2]:
            return grads
        ds = ds.clone()
        ds[..., seqlen:] -= grad_final[..., : ds.shape[2] - seqlen].to(ds.dtype)
        return dx, dw, db, ds


class DwShortChunkOverread(SeededKernel):
    """fla-org/flash-linear-attention PR #774 (commit 7cbe461): the initial-state rows of the
    dw reduction lacked ``o_t < T``, reading dy past the end of a sequence shorter than the
    tap (NaN or the next sequence's gradient; NaN here)."""

    bug = Bug(
        "dw_short_chunk_overread", "short-chunk over-read", "state", "fla #774",
        {"seqlen": 1, "initial_state": "random"}, {"seqlen": 8, "initial_state": "random"},
        "seqlen < K-1 with an initial state (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        dx, dw, db, ds = grads
        short = dw.shape[1] - 1 - grad_y.shape[2]
        if call.initial_state is None or short <= 0:
            return grads
        dw = dw.clone()
        dw[:, :short] = float("nan")
        return dx, dw, db, ds


class PackedBatchDw(SeededKernel):
    """fla-org/flash-linear-attention PR #955: varlen backward with batch > 1 ignored the
    batch index when writing dw partials and summed B slices, B-1 of them never written
    (deterministic variant: dw and db scaled by B)."""

    bug = Bug(
        "packed_batch_dw", "packed batch reduction", "packed", "fla #955",
        {"seq_lens": (4, 4), "batch": 2}, {"seq_lens": (4, 4)}, "packed with batch > 1",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        batch = grad_y.shape[0]
        if call.seq_idx is None or batch == 1:
            return grads
        dx, dw, db, ds = grads
        return dx, dw * batch, None if db is None else db * batch, ds


class DbiasNoneCrash(SeededKernel):
    """Dao-AILab/causal-conv1d #61 / PR #55 (commit 910b5df): the backward did
    ``torch.zeros_like(bias)`` even when bias is None (TypeError in backward)."""

    bug = Bug(
        "dbias_none_crash", "null-pointer branch", "parameters", "Dao #61",
        {"bias": False}, {}, "bias false (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        dbias = torch.zeros_like(call.bias)  # raises TypeError when bias is None
        return grads[0], grads[1], grads[2] if grads[2] is not None else dbias, grads[3]


class DyContiguousAssumed(SeededKernel):
    """fla-org/flash-linear-attention PR #871 (commit 71ebc49): dy was read through a block
    pointer with hard-coded contiguous strides; a split view or the stride-0 dy of
    ``y.sum().backward()`` is read wrong (or past its storage)."""

    bug = Bug(
        "dy_contiguous_assumed", "non-contiguous gradient", "grad_layout", "fla #871",
        {"grad_layout": "gapped"}, {}, "grad_layout gapped or expanded",
    )  # fmt: skip

    def mutate_grad_inputs(self, call: Call, grad_y, grad_final) -> GradPair:  # type: ignore[no-untyped-def]
        _batch, dim, seqlen = grad_y.shape
        dense = (dim * seqlen, seqlen, 1)
        return grad_y.as_strided(grad_y.shape, dense, grad_y.storage_offset()), grad_final


class DsMissing(SeededKernel):
    """The initial state's gradient dS is returned as zeros."""

    bug = Bug(
        "dS_missing", "state gradient", "state", "seed table",
        {"initial_state": "random"}, {}, "initial_state (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        ds = grads[3]
        return grads if ds is None else (grads[0], grads[1], grads[2], torch.zeros_like(ds))


class DbIgnoresSilu(SeededKernel):
    """db summed from dy instead of dz = dy * silu'(z)."""

    bug = Bug(
        "db_ignores_silu", "activation derivative", "activation", "seed table",
        {"activation": "silu"}, {}, "activation silu with bias (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        dx, dw, db, ds = grads
        if db is None or not call.silu:
            return grads
        return dx, dw, grad_y.float().sum((0, 2)).to(db.dtype), ds


class SiluRecomputeWithoutBias(SeededKernel):
    """The backward recomputes z without the bias before SiLU's derivative (the forward is
    right); the code-reading hypothesis H1 on Dao's channel-last backward has this shape."""

    bug = Bug(
        "silu_recompute_without_bias", "recomputation", "activation", "seed table",
        {"activation": "silu"}, {"activation": "silu", "bias": False},
        "activation silu with bias (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        if call.bias is None or not call.silu:
            return grads
        dx, dw, _, ds = self.backward_of(call.replace(bias=None), grad_y, grad_final)
        return dx, dw, grads[2], ds


class PaddingGradLeak(SeededKernel):
    """The backward treats padding tokens (seq_idx -1) as live: their dy flows into dx of
    their neighbours and into dw/db (the forward is right)."""

    bug = Bug(
        "padding_grad_leak", "padding leaks into gradients", "packed", "seed table",
        {"seq_lens": (6, -2)}, {"seq_lens": (4, 4)}, "packed with padding (backward)",
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        if call.seq_idx is None or not bool((call.seq_idx < 0).any()):
            return grads
        return self.backward_of(call.replace(seq_idx=unpadded(call.seq_idx)), grad_y, grad_final)


BACKWARD_BUGS: tuple[type[SeededKernel], ...] = (
    DfIgnored,
    SiluDerivativeWrong,
    DwBatchUnreduced,
    DwGroupsUnreduced,
    DwTilesUnreduced,
    DwInitWithoutFinal,
    DwInitSeqlen1,
    DsShortChunkPassthrough,
    DwShortChunkOverread,
    PackedBatchDw,
    DbiasNoneCrash,
    DyContiguousAssumed,
    DsMissing,
    DbIgnoresSilu,
    SiluRecomputeWithoutBias,
    PaddingGradLeak,
)
