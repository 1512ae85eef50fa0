"""The guards checked after every kernel call (runners.case.guards): the fast check agrees with the
element-by-element one, a changed copy is what placing the changed values gives, damage is
found and repaired, the torch path runs on copies of the placed inputs; and the time between
a process's cases is a phase of its own."""

from __future__ import annotations

import sys
import time

import pytest
import torch

import convmatrix.runners.case.inputs as inputs_module
from convmatrix.core.case import Case
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.registry import load
from convmatrix.runners.case.execute import Context, run_case, run_guarded
from convmatrix.runners.case.guards import (
    damage,
    fresh_copy,
    intact,
    keep_pristine,
    restore,
    runs,
)
from convmatrix.runners.case.inputs import build_forward, place

CPU = torch.device("cpu")
LAYOUTS = [("channel_first", None), ("channel_last", None), ("channel_first", "row_pad"),
           ("channel_last", "channel_slice"), ("channel_first", "batch_pad")]  # fmt: skip


def _placed(layout: str, gap: str | None, dtype=torch.bfloat16):
    values = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0)).to(dtype)
    return place("x", values, CPU, layout, gap)


@pytest.mark.parametrize(("layout", "gap"), LAYOUTS)
def test_the_fast_check_sees_what_the_element_checks_see_and_restore_repairs(layout, gap):
    g = _placed(layout, gap)
    g.keep_pristine()
    gap_at = int(torch.nonzero(~g.covered)[-1])
    with torch.no_grad():
        g.base[gap_at] = 0.0  # a write outside the view
        g.view[1, 2, 3] = 7.0  # and into the input
    assert not intact(g)
    found = damage([g])
    assert len(found) == 2 and "outside the view were written" in found[0], found
    assert "1 element(s) modified (first at [1, 2, 3])" in found[1], found
    restore([g])
    assert intact(g) and damage([g]) == []


def test_another_nan_in_a_gap_is_not_damage():
    """The fast check compares bits; a NaN of another payload is still NaN: the element
    checks decide, and find nothing."""
    g = _placed("channel_first", "row_pad", torch.float32)
    g.keep_pristine()
    gap_at = int(torch.nonzero(~g.covered)[0])
    g.base.view(torch.int32)[gap_at] = 0x7FC00001  # a quiet NaN, another payload
    assert not intact(g) and damage([g]) == []


def test_runs_of_a_mask_are_its_slices():
    mask = torch.tensor([True, True, False, True, False, False, True])
    assert runs(mask) == [slice(0, 2), slice(3, 4), slice(6, 7)]
    assert runs(torch.zeros(3, dtype=torch.bool)) == []


def test_the_time_between_two_cases_is_the_second_ones_between_phase():
    a = Case("t", "fwd", 4, 8, 1, seqlen=16)
    b = Case("t", "fwd", 4, 8, 1, seqlen=17)
    ctx = Context(TorchKernel())
    first = run_guarded(a, ctx)
    time.sleep(0.3)
    second = run_guarded(b, ctx)
    assert 0.3 <= second.phases["between"] < 0.3 + first.duration_s + 5
    assert second.duration_s < sum(v for k, v in second.phases.items() if k != "between") + 1e-3


def test_a_fresh_copy_holds_the_placed_inputs_in_storage_of_its_own():
    case = Case("t", "fwd_bwd", 4, 6, 2, seqlen=9, layout="channel_last", gap="channel_slice",
                initial_state="random")  # fmt: skip
    inputs = build_forward(case, CPU)
    keep_pristine(inputs)
    copy = fresh_copy(inputs)
    for a, b in zip(inputs.guarded(), copy.guarded(), strict=True):
        assert b.base.data_ptr() != a.base.data_ptr() and b.view.stride() == a.view.stride()
        assert torch.equal(b.view, a.values) and torch.equal(b.base.isnan(), a.base.isnan())


def test_the_torch_path_runs_on_copies_not_on_a_second_draw():
    """The torch path drew the case's tensors again (torch.randn: as much as the case's
    inputs phase); now it copies the placed ones."""
    case = Case("t", "fwd_bwd", 4, 6, 2, seqlen=9, initial_state="random", final_state=True,
                dfinal="random")  # fmt: skip
    code, draws = inputs_module._randn.__code__, []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            draws.append(frame.f_locals["stream"])

    sys.setprofile(profile)
    try:
        result = run_case(case, Context(load("tiled")))
    finally:
        sys.setprofile(None)
    assert result.outcome == "passed"
    assert sorted(draws) == ["bias", "g", "q", "state", "weight", "x"]
