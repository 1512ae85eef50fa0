"""run_case on hand-made cases: honest kernels pass, each planted defect is caught where it is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.oracle.reference import ReferenceKernel
from convmatrix.runners.case.execute import Context, build_inputs, run_case

sys.path.insert(0, str(Path(__file__).parent / "resources" / "kernels"))
import bad_kernels

FWD_BWD = dict(suite="t", op="fwd_bwd", width=4, dim=12, batch=2, seqlen=19)
FULL = dict(activation="silu", initial_state="random", final_state=True, dfinal="random")


def case(**kw) -> Case:
    return Case(**{**FWD_BWD, **kw})


CASES = [
    case(**FULL, layout="channel_last", gap="channel_slice", checks=("causality",)),
    case(**FULL, gap="row_pad", checks=("chunk_consistency",)),
    case(x_dtype="bfloat16", w_dtype="float32", gap="batch_pad", activation="silu",
         seq_lens=(6, -2, 7, 4), checks=("packed_isolation", "chunk_consistency")),
    case(x_dtype="float16", w_dtype="float16", seqlen=2, **FULL),  # short chunk: L < K-1
    case(op="fwd", width=3, bias=False, initial_state="zeros", final_state=True),
    Case("t", "update", 4, 12, 3, tokens=2, steps=3, state_len=5, circular=True,
         slots="permuted_pad", activation="silu"),
    Case("t", "update", 2, 12, 2, tokens=3, steps=2, state_len=1, layout="channel_last",
         x_dtype="bfloat16", w_dtype="bfloat16", slots="permuted"),
]  # fmt: skip


def outputs_of(result):
    return {o.output: o for o in result.outputs}


@pytest.mark.parametrize("kernel", [TorchKernel(), ReferenceKernel()], ids=["torch", "reference"])
@pytest.mark.parametrize("c", CASES, ids=[c.pytest_id for c in CASES])
def test_honest_kernels_pass_with_every_output_and_property_recorded(kernel, c):
    result = run_case(c, Context(kernel))
    assert result.outcome == "passed", "\n".join(str(o) for o in result.outputs)
    names = set(outputs_of(result))
    if c.op == "update":
        assert names == {"y", "state"}
        assert outputs_of(result)["state"].e_abs == 0.0  # copies of inputs: bit for bit
    else:
        expected = {"y"} | ({"F"} if c.final_state else set())
        if c.op == "fwd_bwd":
            expected |= {"dx", "dw"} | ({"db"} if c.bias else set())
            expected |= {"dS"} if c.initial_state not in (None, "none") else set()
        assert names == expected
    props = {p.name for p in result.properties}
    assert "guards" in props and set(c.checks) <= props
    assert all(o.fw_rel is not None for o in result.outputs)


def test_reversed_taps_fail_exactly_the_weight_dependent_outputs():
    r = run_case(case(**FULL), Context(bad_kernels.ReversedTaps()))
    failing = {o.output for o in r.outputs if not o.passed}
    assert r.outcome == "failed"
    # F is a copy of inputs; everything else depends on the weights through z.
    assert failing == {"y", "dx", "dw", "db", "dS"}
    # Without SiLU, db = sum of g does not depend on the weights either.
    r = run_case(
        case(initial_state="random", final_state=True), Context(bad_kernels.ReversedTaps())
    )
    assert {o.output for o in r.outputs if not o.passed} == {"y", "dx", "dw", "dS"}
    # The torch path's own errors are recorded beside the kernel's, and they are small.
    assert all(o.fw_rel < 1e-5 for o in r.outputs)


@pytest.mark.parametrize(
    "c",
    [case(**FULL, gap="row_pad"), Case("t", "update", 4, 8, 2, tokens=1, steps=2, state_len=3)],
    ids=["forward", "update"],
)
def test_guards_catch_a_store_one_element_past_the_buffer(c):
    r = run_case(c, Context(bad_kernels.WritesPastOutput()))
    guards = next(p for p in r.properties if p.name == "guards")
    assert r.outcome == "failed" and not guards.passed
    assert "1 element(s) outside the view were written" in guards.detail
    assert all(o.passed for o in r.outputs)  # the numbers themselves are right


def test_a_kernel_that_raises_fails_with_its_message():
    r = run_case(case(), Context(bad_kernels.RaisesAlways()))
    assert r.outcome == "failed"
    assert "kernel raised RuntimeError: kernel launch failed" in r.message


def test_expected_error_cases_pass_only_on_a_clean_contract_error():
    c = case(width=5, expect="error", expect_reason="width 5 not declared")
    r = run_case(c, Context(bad_kernels.Width4Only()))
    assert (r.outcome, r.message) == ("passed", "raised ContractError: width 5 not supported")
    r = run_case(c, Context(TorchKernel()))
    assert r.outcome == "failed" and "returned normally" in r.message
    r = run_case(c, Context(bad_kernels.RaisesAlways()))
    assert r.outcome == "failed" and "raised RuntimeError" in r.message
    assert "expected one of: ContractError" in r.message


def test_missing_features_skip_with_the_reason():
    r = run_case(case(), Context(bad_kernels.ForwardOnly()))
    assert r.outcome == "skipped"
    assert r.message == "kernel 'forward_only' lacks feature(s) backward"


def test_causality_property_catches_a_kernel_that_reads_ahead():
    r = run_case(case(op="fwd", checks=("causality",)), Context(bad_kernels.NonCausal()))
    prop = next(p for p in r.properties if p.name == "causality")
    assert not prop.passed and "changing x[10:]" in prop.detail


def test_packed_isolation_catches_a_kernel_that_ignores_seq_idx():
    c = case(op="fwd", seq_lens=(5, 6, -1, 7), checks=("packed_isolation",))
    r = run_case(c, Context(bad_kernels.LeaksAcrossSamples()))
    prop = next(p for p in r.properties if p.name == "packed_isolation")
    assert not prop.passed and "changing even samples" in prop.detail


PACKED_CHECKS = dict(op="fwd", seq_lens=(5, 6, -1, 7), checks=("causality", "packed_isolation"))


def test_one_changed_forward_serves_causality_and_packed_isolation():
    r = run_case(case(**PACKED_CHECKS), Context(TorchKernel()))
    props = {p.name: p for p in r.properties}
    assert props["causality"].passed and props["packed_isolation"].passed
    # the one changed forward is causality's; packed isolation judges its y
    assert (props["causality"].forward_calls, props["packed_isolation"].forward_calls) == (1, 0)
    # samples [0,5) [5,11) pad [11,12) [12,19): the cut is L/2 = 9, its next time step in the
    # same sample (1), which has a sample after it: y[:10] kept, the odd samples changed after
    assert props["causality"].detail == "y[:10] unchanged"
    assert props["packed_isolation"].detail == "the other samples unchanged"


@pytest.mark.parametrize(
    "kernel, caught",
    [
        (bad_kernels.NonCausal, {"causality"}),
        (bad_kernels.LooksAheadInSample, {"causality"}),
        (bad_kernels.LeaksAcrossSamples, {"packed_isolation"}),
    ],
)
def test_the_shared_change_catches_what_each_check_caught_alone(kernel, caught):
    """A look-ahead inside a sample shows at the cut alone (the sample ends are masked); a
    leak across samples in the kept samples after a changed one; each bug is also caught
    when its check runs alone."""
    shared = run_case(case(**PACKED_CHECKS), Context(kernel()))
    failed = {p.name: p.detail for p in shared.properties if not p.passed}
    assert set(failed) == caught
    assert all("changing x[10:] of the odd samples" in d for d in failed.values())
    for name in caught:
        alone = run_case(case(**{**PACKED_CHECKS, "checks": (name,)}), Context(kernel()))
        assert not next(p for p in alone.properties if p.name == name).passed


def test_chunk_consistency_splits_inside_a_sample_and_agrees_for_torch():
    c = case(seq_lens=(9, 10), checks=("chunk_consistency",), **FULL)
    r = run_case(c, Context(TorchKernel()))
    prop = next(p for p in r.properties if p.name == "chunk_consistency")
    # The split nearest L/2 = 9 where tokens s-K+1..s share one sample: token 9 starts
    # sample 1 (its window 6..9 spans both), token 8's window 5..8 lies in sample 0.
    assert prop.passed and prop.detail == "split at 8 agrees"


@pytest.mark.parametrize("c", CASES, ids=[c.pytest_id for c in CASES])
def test_kernels_sharing_a_case_memo_record_what_they_record_alone(c):
    """The memo hands the second kernel the torch path of the first: every
    recorded number equals a run without it (the case's tensors depend on the case alone)."""
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.case.execute import CaseMemo

    memo = CaseMemo()
    kernels = [TorchKernel(), load("tiled")]
    shared = [run_case(c, Context(k, memo=memo)) for k in kernels]
    assert memo.case_id == c.id and memo.framework is not None
    alone = [run_case(c, Context(k)) for k in kernels]
    for s, a in zip(shared, alone, strict=True):
        assert s.outcome == a.outcome == "passed"
        assert s.outputs == a.outputs


@pytest.mark.parametrize("c", CASES[:5], ids=[c.pytest_id for c in CASES[:5]])
def test_judging_in_channel_blocks_records_what_one_block_records(c, monkeypatch):
    """One channel per block against the whole tensor at once: the same errors, usages and
    verdicts. Tolerance 1e-6 relative: the float64 reference's per-channel sums (dw, db) and
    the sums of squares add up in another order, a few ulps of r, and an fp32 error of 1e-8
    of |r| turns an ulp of r into 1e-8 of itself."""
    from convmatrix.runners.case import reference

    whole = run_case(c, Context(TorchKernel()))
    monkeypatch.setattr(reference, "BLOCK_ELEMENTS", 1)
    blocks = reference.channel_blocks(c, build_inputs(c, torch.device("cpu")))
    assert len(blocks) == c.dim
    blocked = run_case(c, Context(TorchKernel()))
    assert blocked.outcome == whole.outcome == "passed"
    for b, w in zip(blocked.outputs, whole.outputs, strict=True):
        assert b.output == w.output
        for field in ("e_abs", "e_rel", "e_norm", "scale", "bound_usage", "fw_rel"):
            assert getattr(b, field) == pytest.approx(getattr(w, field), rel=1e-6, abs=1e-300)
