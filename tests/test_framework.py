"""The framework path ``torch`` agrees with the float64 reference within fp32 tolerance."""

from __future__ import annotations

import pytest
import torch

from convmatrix.kernels import load
from convmatrix.kernels.oracle.reference import reference_forward

# fp32 rounding of a K-term sum of O(1) products plus SiLU: the error is a few ulps of the
# data scale (~1e-7 relative); 2e-5 absolute on O(1)..O(10) values leaves 10-100x headroom
# and is still 4+ orders of magnitude below any indexing error.
ATOL = 2e-5


def _inputs(seed, batch=2, dim=5, seqlen=13, width=4):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(*s, generator=gen)
        for s in ((batch, dim, seqlen), (dim, width), (dim,), (batch, dim, width - 1))
    ]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("seqlen", [13, 2], ids=["long", "shorter-than-state"])
def test_torch_forward_backward_matches_reference(packed, activation, seqlen):
    # seqlen 2 < K-1: the final state is part initial state, part x (and dS flows from it).
    x, w, b, s = _inputs(0, seqlen=seqlen)
    ids = torch.tensor([[0] * 4 + [1] * 6 + [-1] * 3, [5] * 13])[:, :seqlen]
    seq_idx = ids if packed else None
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(x.shape, generator=gen)
    q = torch.randn(s.shape, generator=gen)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).clone().requires_grad_(True) for t in (x, w, b, s)]
        y, final = fn(
            leaves[0],
            leaves[1],
            leaves[2],
            initial_state=leaves[3],
            seq_idx=seq_idx,
            return_final_state=True,
            activation=activation,
        )
        ((y * g.to(dtype)).sum() + (final * q.to(dtype)).sum()).backward()
        return [y, final] + [t.grad for t in leaves]

    ours = run(load("torch").forward, torch.float32)
    ref = run(reference_forward, torch.float64)
    for name, a, r in zip(("y", "F", "dx", "dw", "db", "dS"), ours, ref, strict=True):
        assert a.dtype == torch.float32, name
        assert torch.allclose(a.double(), r.detach(), atol=ATOL, rtol=0), name


@pytest.mark.parametrize("ring", [False, True])
def test_torch_update_matches_reference_kernel(ring):
    x, w, b, _ = _inputs(2, batch=3, seqlen=3)
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(4, 5, 6, generator=gen)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32)
    seqlens = torch.tensor([5, 0, 11], dtype=torch.int32) if ring else None
    pools = {name: pool.clone() for name in ("torch", "reference")}
    ys = {
        name: load(name).update(
            x, pools[name], w, b, activation="silu", cache_seqlens=seqlens, state_indices=slots
        )
        for name in pools
    }
    assert torch.allclose(ys["torch"], ys["reference"], atol=ATOL, rtol=0)
    assert torch.equal(pools["torch"], pools["reference"])  # states are copies of inputs
