"""Case tensors: deterministic from the case id, rounded first, real strided views, NaN guards."""

from __future__ import annotations

import math

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.kernels.oracle.reference import conv_forward
from convmatrix.runners.case.inputs import (
    GUARD,
    build_forward,
    build_update,
    case_seed,
    place,
    seq_idx_for,
)


def fwd_case(**kw) -> Case:
    params = dict(suite="t", op="fwd_bwd", width=4, dim=24, batch=2, seqlen=40)
    params.update(activation="silu", initial_state="random", final_state=True, dfinal="random")
    params.update(kw)
    return Case(**params)


def test_same_case_same_values_and_other_case_other_values():
    case = fwd_case()
    a, b = build_forward(case), build_forward(case)
    for name in ("x", "weight", "bias", "initial_state"):
        assert torch.equal(getattr(a, name).values, getattr(b, name).values), name
    assert torch.equal(a.g, b.g) and torch.equal(a.q, b.q)
    other = build_forward(fwd_case(batch=3))
    assert not torch.equal(a.weight.values, other.weight.values)


def test_seed_comes_from_the_case_id_and_streams_differ():
    case = fwd_case()
    seeds = {case_seed(case, s) for s in ("x", "weight", "bias", "state", "g", "q")}
    assert len(seeds) == 6
    # The seed is a pure function of the id: a Case rebuilt from JSON draws the same data.
    again = Case.from_json(case.to_json())
    assert case_seed(again, "x") == case_seed(case, "x")
    assert int(case.id, 16) == (case_seed(case, "x") - 0x9E3779B97F4A7C15) % 2**63


@pytest.mark.parametrize(("x_dtype", "w_dtype"), [("bfloat16", "float32"), ("float16", "float16")])
def test_values_are_rounded_to_the_case_dtypes(x_dtype, w_dtype):
    fi = build_forward(fwd_case(x_dtype=x_dtype, w_dtype=w_dtype))
    assert fi.x.values.dtype == getattr(torch, x_dtype) == fi.x.view.dtype
    assert fi.initial_state.values.dtype == getattr(torch, x_dtype)
    assert fi.g.dtype == fi.q.dtype == getattr(torch, x_dtype)
    assert fi.weight.values.dtype == fi.bias.values.dtype == getattr(torch, w_dtype)


def test_silu_inputs_straddle_zero():
    """Zero-mean x and weights ~ N(0, 1/K): about half the pre-activations are negative.

    With 2*24*40 = 1920 samples of a symmetric variable the positive fraction has a standard
    deviation of ~0.011; [0.35, 0.65] is > 10 of them from 0.5.
    """
    fi = build_forward(fwd_case())
    _, _, saved = conv_forward(
        fi.x.values, fi.weight.values, fi.bias.values, fi.initial_state.values, None, "silu"
    )
    positive = float((saved.z > 0).double().mean())
    assert 0.35 < positive < 0.65
    assert abs(float(fi.x.values.float().mean())) < 0.1  # 1920 N(0,1) draws: sd 0.023


@pytest.mark.parametrize(
    ("layout", "gap", "strides"),
    [
        # (B, C, L) = (2, 24, 40); pads of 8 elements, channel slices with 8 extra each side
        ("channel_first", None, (24 * 40, 40, 1)),
        ("channel_last", None, (40 * 24, 1, 24)),
        ("channel_last", "channel_slice", (40 * 40, 1, 40)),
        ("channel_first", "channel_slice", (40 * 40, 40, 1)),
        ("channel_first", "row_pad", (24 * 48, 48, 1)),
        ("channel_last", "row_pad", (40 * 32, 1, 32)),
        ("channel_first", "batch_pad", (24 * 40 + 8, 40, 1)),
    ],
)
def test_layouts_are_real_strided_views(layout, gap, strides):
    fi = build_forward(fwd_case(layout=layout, gap=gap))
    view = fi.x.view
    assert view.shape == (2, 24, 40)
    assert view.stride() == strides
    assert view.data_ptr() != fi.x.base.data_ptr()  # a guard band precedes the view
    assert view.untyped_storage().data_ptr() == fi.x.base.untyped_storage().data_ptr()
    assert torch.equal(view, fi.x.values)
    outside = fi.x.base.numel() - view.numel()
    assert int(torch.isnan(fi.x.base).sum()) == outside >= 2 * GUARD


def test_channel_last_is_a_transposed_b_l_c_buffer():
    view = build_forward(fwd_case(layout="channel_last")).x.view
    assert view.transpose(1, 2).is_contiguous()


def test_guards_see_a_store_past_the_end_and_into_a_gap():
    g = place("x", torch.randn(2, 3, 5), torch.device("cpu"), "channel_first", "row_pad")
    assert g.gap_damage() is None and g.value_damage() is None
    # One past the end of the first row (length 5) lands in that row's padding.
    torch.as_strided(g.view, (1,), (1,), g.view.storage_offset() + 5).fill_(0.0)
    assert "outside the view" in g.gap_damage()
    h = place("w", torch.randn(3, 4), torch.device("cpu"))
    torch.as_strided(h.view, (1,), (1,), h.view.storage_offset() + 12).fill_(1.0)
    assert "1 element(s) outside" in h.gap_damage()


def test_guards_see_a_modified_input_bit_for_bit():
    g = place("x", torch.tensor([[[1.0, -0.0, 2.0]]]), torch.device("cpu"))
    g.view[0, 0, 1] = 0.0  # -0.0 -> +0.0 compares equal as floats, not as bits
    assert "1 element(s) modified (first at [0, 0, 1])" in g.value_damage()


def test_seq_idx_numbers_samples_and_marks_padding():
    ids = seq_idx_for((3, -2, 2), batch=2)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [[0, 0, 0, -1, -1, 1, 1]] * 2


def test_update_inputs_leave_unnamed_pool_rows_and_pad_slots():
    case = Case(
        "t", "update", 4, 8, 3, tokens=2, steps=3, state_len=5, circular=True, slots="permuted_pad"
    )
    ui = build_update(case)
    pool_rows = ui.pool.view.shape[0]
    assert pool_rows == case.batch + 2
    assert ui.slots.tolist()[1] == -1  # odd rows are padding
    assert set(ui.named_rows) == {s for s in ui.slots.tolist() if s >= 0}
    assert len(ui.named_rows) < pool_rows  # some rows belong to no slot: guarded
    assert [len(s) for s in ui.cache_seqlens] == [3] * 3
    steps = torch.stack(ui.cache_seqlens)  # (steps, B): each step advances by the tokens
    assert torch.equal(steps[1:] - steps[:-1], torch.full((2, 3), case.tokens, dtype=torch.int32))
    assert len(ui.xs) == 3 and ui.xs[0].view.shape == (3, 8, 2)
    assert not math.isnan(float(ui.pool.view.sum()))
