"""Seeded bugs that show only past a size: ``SIZE_BUGS``, a catalogue of their own.

Real kernels break where their arithmetic runs out (../shared/research/upstream_bugs.md §G):
offsets past what their integer (or float) type holds, a workspace sized for a typical
batch, block counts capped by the hardware, a second reduction level that only runs on long
sequences. Each bug here is ``tiled`` with one such limit, correct up to its ``Threshold``
and wrong just past it, so a case one past the limit fails and the case at it passes
(``tests/test_size_bugs.py`` builds both from the declared threshold).

They live apart from ``CATALOGUE`` because no fixed matrix of a sane size reaches them:
``nightly`` kills every bug of ``CATALOGUE`` by construction, and its largest case holds
about 38k elements. ``convmatrix adequacy --catalogue size`` measures a matrix against
these (docs/search.md, "Size bugs"); ``convmatrix shrink`` and ``explore`` are the tools
meant to find and explain them.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.builtin.tiled.backward import Gradients
from convmatrix.kernels.doubles.seeded.backward_bugs import masked, params_from
from convmatrix.kernels.doubles.seeded.base import Bug, Call, SeededKernel, Threshold

__all__ = ["SIZE_BUGS"]

# A float32 holds every integer up to 2^24; 2^24 + 1 is the first index it rounds (to 2^24).
FP32_EXACT = 2**24
WORKSPACE_TOKENS = 8192
THREADS_PER_BLOCK = 1024
FIRST_LEVEL_TOKENS = 4096


class FlatIndexFp32(SeededKernel):
    """The 32-bit offset family (upstream_bugs.md #29: Dao PR #114, sglang #29602, vLLM #40905)
    in its float form: the flat element index ``(b*C + c)*L + t`` is carried in an fp32
    register (a Triton kernel's index math through ``tl.float32``, a ``float`` loop counter),
    exact up to 2^24 and rounded to an even neighbour past it, so x is read one element off
    at odd flat indices beyond 2^24 + 1 (the first index an fp32 cannot hold)."""

    bug = Bug(
        "flat_index_fp32", "offsets past 2^24 in fp32", "size", "Dao PR #114",
        {"op": "fwd", "dim": 4096, "seqlen": 4097}, {"op": "fwd", "dim": 4096, "seqlen": 4096},
        "batch x dim x seqlen > 2^24 + 1 elements (e.g. C 4096, L 4097)",
        Threshold("batch*dim*seqlen", FP32_EXACT + 1),
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        x = call.x
        if x.numel() <= FP32_EXACT + 1:
            return call
        flat = x.contiguous().view(-1)
        index = torch.arange(flat.numel(), device=x.device).to(torch.float32).to(torch.int64)
        read = flat[index.clamp_(max=flat.numel() - 1)].view(x.shape)
        return call.replace(x=torch.empty_like(x).copy_(read))  # x's layout kept


class DwWorkspace8192(SeededKernel):
    """fla-org/flash-linear-attention PR #955's pattern (dw partials in a workspace of
    ``B*NT`` rows, summed after): here the per-token partials of dw and db go to a workspace
    sized for 8192 tokens of the flattened ``(B, L)`` axis, and the kernel guards its writes
    instead of growing it, so tokens past ``B*L = 8192`` never reach dw and db."""

    bug = Bug(
        "dw_workspace_8192", "workspace sized for B*L", "batch B", "fla #955",
        {"batch": 2, "seqlen": 4097}, {"batch": 2, "seqlen": 4096},
        "batch x seqlen > 8192 (backward)",
        Threshold("batch*seqlen", WORKSPACE_TOKENS),
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        batch, _, seqlen = grad_y.shape
        if batch * seqlen <= WORKSPACE_TOKENS:
            return grads
        rows = torch.arange(batch * seqlen).view(batch, seqlen)
        return params_from(
            grads, self.backward_of(call, masked(grad_y, rows < WORKSPACE_TOKENS), None)
        )


class ChannelBlocks1024(SeededKernel):
    """Block limits on the channel axis (Dao-AILab/causal-conv1d #32: dim past the grid
    limit; fla #1097): a kernel that gives each channel a thread of one block, at most 1024
    threads, loops the block over the channels past 1024 but indexes weight and bias by
    ``threadIdx.x``, so channel c > 1023 uses channel ``c mod 1024``'s weights."""

    bug = Bug(
        "channel_blocks_1024", "block count past 1024 channels", "channels C", "Dao #32",
        {"dim": 1025}, {"dim": 1024}, "dim > 1024",
        Threshold("dim", THREADS_PER_BLOCK),
    )  # fmt: skip

    def mutate_inputs(self, call: Call) -> Call:
        dim = call.weight.shape[0]
        if dim <= THREADS_PER_BLOCK:
            return call
        lane = torch.arange(dim, device=call.weight.device) % THREADS_PER_BLOCK
        bias = None if call.bias is None else call.bias[lane]
        return call.replace(weight=call.weight[lane], bias=bias)


class SecondLevelReduction(SeededKernel):
    """fla-org/flash-linear-attention #981 / PR #992: relaunched in chunks, the dense
    backward needed ``i_tg = i_b*NT + i_t`` to stop dw/db mis-indexing across chunks. Here
    dw and db are reduced over at most 4096 tokens per block, and the second level, run only
    when a row is longer, reads block 0's partial for every block of the row."""

    bug = Bug(
        "second_level_4096", "second-level reduction past 4096 tokens", "length L", "fla #992",
        {"seqlen": 4097}, {"seqlen": 4096}, "seqlen > 4096 (backward)",
        Threshold("seqlen", FIRST_LEVEL_TOKENS),
    )  # fmt: skip

    def mutate_grads(self, call, grads, grad_y, grad_final) -> Gradients:  # type: ignore[no-untyped-def]
        batch, _, seqlen = grad_y.shape
        blocks = -(-seqlen // FIRST_LEVEL_TOKENS)
        if blocks <= 1:
            return grads
        first = (torch.arange(seqlen) < FIRST_LEVEL_TOKENS).expand(batch, seqlen)
        dx, dw, db, ds = self.backward_of(call, masked(grad_y, first), None)
        return params_from(grads, (dx, dw * blocks, None if db is None else db * blocks, ds))


SIZE_BUGS: tuple[type[SeededKernel], ...] = (
    FlatIndexFp32,
    DwWorkspace8192,
    ChannelBlocks1024,
    SecondLevelReduction,
)
