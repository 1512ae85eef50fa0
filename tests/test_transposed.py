"""``transposed.copy_into`` copies exactly what ``Tensor.copy_`` copies, whichever way it goes:
both directions between channel-last and channel-first, dense, with gapped rows and as a
channel block of a wide tensor, across dtypes, and below the size where it takes torch's copy.
"""

from __future__ import annotations

import pytest
import torch

from convmatrix.runners.case.transposed import copy_into

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _channel_last(batch: int, dim: int, length: int, dtype: torch.dtype, kind: str) -> torch.Tensor:
    """A (B, C, L) channel-last view: dense, rows with a gap, or a block of a wider tensor."""
    wide = {"dense": dim, "gap": dim + 16, "block": 4 * dim + 1100}[kind]
    start = 0 if kind == "dense" else 8
    storage = torch.randn(batch, length, wide).to(dtype)
    return storage.transpose(1, 2)[:, start : start + dim]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["dense", "gap", "block"])
# 1100 and 2100 channels: rows far enough apart (4-8 KB in float32, 2-4 KB in 2-byte dtypes)
# for the blocked path in each direction; 5 channels and 1 channel: torch's own copy.
@pytest.mark.parametrize("shape", [(2, 1100, 80), (1, 2100, 40), (1, 5, 9), (3, 1, 4000)], ids=str)
def test_reading_a_channel_last_tensor_into_float64_copies_every_bit(dtype, kind, shape):
    src = _channel_last(*shape, dtype, kind)
    src[0, 0, 0] = float("nan")  # NaN and inf pass through as they are
    src[-1, -1, -1] = float("-inf")
    expected = torch.empty(shape, dtype=torch.float64).copy_(src)
    got = copy_into(torch.empty(shape, dtype=torch.float64), src)
    assert torch.equal(got.view(torch.int64), expected.view(torch.int64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["dense", "gap", "block"])
def test_placing_values_into_a_channel_last_view_copies_every_bit_and_nothing_else(dtype, kind):
    dst = _channel_last(2, 1100, 80, dtype, kind)
    base = dst.as_strided((dst.untyped_storage().nbytes() // dst.element_size(),), (1,), 0)
    before = base.clone()
    values = torch.randn(2, 1100, 80).to(dtype)
    copy_into(dst, values)
    assert torch.equal(dst, values)
    # storage outside the view (gaps, other channels) untouched
    outside = torch.ones_like(base, dtype=torch.bool)
    outside.as_strided(dst.shape, dst.stride(), dst.storage_offset()).fill_(False)
    assert torch.equal(base[outside], before[outside])


def test_a_float64_reading_of_a_bfloat16_channel_block_keeps_strides_of_the_destination():
    src = _channel_last(2, 64, 512, torch.bfloat16, "block")
    dst = torch.empty(2, 64, 512, dtype=torch.float64)
    assert copy_into(dst, src) is dst and dst.is_contiguous()
    assert torch.equal(dst, src.to(torch.float64))
