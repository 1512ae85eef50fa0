"""No property check, guard or input calls a kernel outside what it declares
(convmatrix.runners.case.applicability, properties, inputs), with kernels that refuse such calls
(tests/resources/kernels/contract_kernels.py): a check that cannot run is "not applicable"
with the reason, a check that raises fails alone and by name, and slots follow the contract."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.verdict import describe
from convmatrix.kernels import load
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.case.applicability import (
    NOT_APPLICABLE,
    _split_lens,
    calls_of,
    refused_call,
)
from convmatrix.runners.case.execute import Context, run_case
from convmatrix.runners.case.inputs import build_update

sys.path.insert(0, str(Path(__file__).parent / "resources" / "kernels"))
import contract_kernels as ck

FWD = Case("t", "fwd_bwd", 4, 12, 2, seqlen=19, activation="silu", initial_state="random")
CHECKS = ("causality", "packed_isolation", "chunk_consistency")


def _props(result) -> dict:
    return {p.name: p for p in result.properties}


def test_split_lens_cut_a_segment_into_both_chunks():
    assert _split_lens((9, 10), 8) == ((8,), (1, 10))
    assert _split_lens((5, -2, 12), 7) == ((5, -2), (12,))
    assert _split_lens((5, -2, 12), 6) == ((5, -1), (-1, 12))
    assert _split_lens(None, 3) == (None, None)


def test_chunk_consistency_describes_its_two_calls_the_whole_is_the_main_call():
    case = Case("t", "fwd", 4, 12, 2, seqlen=19, seq_lens=(9, 10), checks=CHECKS)
    first, second = calls_of("chunk_consistency", case)
    assert (first.seqlen, second.seqlen) == (8, 11)
    assert first.final_state and first.initial_state == "zeros"  # the case has none
    assert second.initial_state == "random" and second.seq_lens == (1, 10)
    assert second.final_state
    # causality repeats the main call's forward, final state as the case asks
    assert [c.final_state for c in calls_of("causality", case)] == [None]
    final = Case("t", "fwd_bwd", 4, 12, 2, seqlen=19, final_state=True, dfinal="random")
    assert [(c.op, c.final_state) for c in calls_of("causality", final)] == [("fwd", True)]


def test_the_issues_false_alarm_a_packed_case_without_final_state_passes():
    """The case asks for no final state; chunk consistency would ask for one with seq_idx."""
    case = Case(**{**FWD.__dict__, "id": "", "seq_lens": (9, 10), "checks": CHECKS})
    result = run_case(case, Context(ck.RejectsPackedFinalState()))
    assert result.outcome == "passed", describe(result)
    props = _props(result)
    assert props["chunk_consistency"].detail == NOT_APPLICABLE + (
        "final state only without packing (seq_idx) (chunk of 8 tokens)"
    )
    assert props["causality"].detail.startswith("y[") and props["packed_isolation"].passed
    assert {o.output for o in result.outputs} == {"y", "dx", "dw", "db", "dS"}


def _run_all(kernel, cases: list[Case]) -> dict[str, list]:
    by_outcome: dict[str, list] = {}
    for case in cases:
        result = run_case(case, Context(kernel))
        by_outcome.setdefault(result.outcome, []).append(result)
    return by_outcome


def test_no_nightly_case_fails_for_a_kernel_rejecting_packed_final_states():
    kernel = ck.RejectsPackedFinalState()
    cases = [c for c in expand_matrix(load_matrix("nightly"), kernel).cases if c.seq_lens]
    assert any(c.checks and c.expect == "ok" for c in cases)
    assert any(c.final_state and c.expect == "error" for c in cases)  # classified, not run
    runs = _run_all(kernel, cases)
    assert set(runs) <= {"passed", "skipped"}, [describe(r) for r in runs.get("failed", [])]
    skipped = [p for r in runs["passed"] for p in r.properties if p.detail.startswith("not app")]
    assert skipped  # some checks were not applicable, and said so


def test_no_nightly_case_fails_for_a_kernel_rejecting_updates_with_s_other_than_k():
    kernel = ck.StateLenK()
    cases = [c for c in expand_matrix(load_matrix("nightly"), kernel).cases if c.op == "update"]
    refused = [c for c in cases if c.state_len != c.width and c.state_len >= c.width - 1]
    assert refused and all(c.expect == "error" and "S == K" in c.expect_reason for c in refused)
    runs = _run_all(kernel, cases)
    assert set(runs) == {"passed"}, [describe(r) for r in runs.get("failed", [])]
    assert len([c for c in cases if c.expect == "ok"]) > 0


def test_a_property_that_raises_fails_alone_and_by_name():
    case = Case(**{**FWD.__dict__, "id": "", "checks": ("causality", "chunk_consistency")})
    result = run_case(case, Context(ck.FailsOnShortCalls()))
    props = _props(result)
    assert result.outcome == "failed" and result.message is None
    assert props["causality"].passed and props["guards"].passed
    chunk = props["chunk_consistency"]
    assert not chunk.passed and chunk.detail.startswith("kernel raised RuntimeError: launch")
    assert all(o.passed for o in result.outputs) and len(result.outputs) == 5
    assert "  chunk_consistency: kernel raised RuntimeError" in "\n".join(describe(result))


def test_a_per_sequence_final_state_makes_chunk_consistency_not_applicable_only_when_short():
    kernel = load("convmatrix.kernels.doubles.standins:mlu_vllm")
    short = Case("t", "fwd", 4, 16, 2, seqlen=19, seq_lens=(17, 2), checks=CHECKS)
    assert "shorter than K-1" in refused_call(kernel, "chunk_consistency", short)
    result = run_case(short, Context(kernel))
    assert result.outcome == "passed", describe(result)
    assert _props(result)["chunk_consistency"].detail.startswith(NOT_APPLICABLE)
    long = Case("t", "fwd", 4, 16, 2, seqlen=19, seq_lens=(9, 10), checks=CHECKS)
    result = run_case(long, Context(kernel))
    assert result.outcome == "passed" and _props(result)["chunk_consistency"].detail.startswith(
        "split at"
    )


UPDATE = Case("t", "update", 4, 8, 3, tokens=2, steps=2, state_len=3, activation="silu")


def test_identity_slots_hand_no_state_indices_to_a_kernel_without_slot_support():
    identity = Case(**{**UPDATE.__dict__, "id": "", "slots": "identity"})
    ui = build_update(identity, "cpu", ck.NoSlots.capabilities)
    assert ui.slots is None and ui.pool.values.shape[0] == 3
    assert run_case(identity, Context(ck.NoSlots())).outcome == "passed"
    permuted = Case(**{**UPDATE.__dict__, "id": "", "slots": "permuted"})
    assert run_case(permuted, Context(ck.NoSlots())).outcome == "skipped"


def test_pad_slot_zero_reserves_pool_row_zero():
    case = Case(**{**UPDATE.__dict__, "id": "", "slots": "permuted_pad"})
    canonical = build_update(case)
    ui = build_update(case, "cpu", Capabilities(pad_slot_id=0))
    live = canonical.slots >= 0
    assert torch.equal(ui.slots[~live], torch.zeros_like(ui.slots[~live]))
    assert bool((ui.slots[live] > 0).all()) and 0 not in ui.named_rows
    # the live rows' histories are the same values, one row down
    assert torch.equal(
        ui.pool.values[ui.slots[live].long()], canonical.pool.values[canonical.slots[live].long()]
    )
    assert torch.equal(ui.canonical_slots()[~live], canonical.slots[~live])
    assert run_case(case, Context(ck.NullBlockZero())).outcome == "passed"
    wrong = run_case(case, Context(ck.NullBlockIgnored()))
    guards = _props(wrong)["guards"]
    assert wrong.outcome == "failed" and "conv_state rows [0" in guards.detail


@pytest.mark.parametrize("kernel", [ck.WritesYIntoX(), ck.WritesYIntoXUndeclared()])
def test_y_written_into_x_is_a_guard_violation_unless_declared(kernel):
    result = run_case(UPDATE, Context(kernel))
    guards = _props(result)["guards"]
    assert all(o.passed for o in result.outputs)
    if kernel.capabilities.inplace_y:
        assert result.outcome == "passed" and guards.passed
    else:
        assert not guards.passed and "x[step 0]: " in guards.detail


def test_the_framework_path_is_compared_on_its_own_slot_convention():
    case = Case(**{**UPDATE.__dict__, "id": "", "slots": "permuted_pad"})
    result = run_case(case, Context(ck.NullBlockZero(), framework=TorchKernel()))
    state = next(o for o in result.outputs if o.output == "state")
    assert state.fw_abs == 0.0 and state.e_abs == 0.0  # copies of inputs, bit for bit
