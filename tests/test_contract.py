"""The declared contract as data (convmatrix.core.contract): each field's rule on Case values,
how the matrix classifies nightly with it, and ``refusal`` (what property checks ask)."""

from __future__ import annotations

import dataclasses

import pytest

from convmatrix.core.case import Case
from convmatrix.core.contract import (
    FEATURES,
    STATE_LEN_ANY,
    STATE_LEN_K,
    STATE_LEN_K_MINUS_1,
    Capabilities,
    StateLens,
    refusal,
)
from convmatrix.kernels import KernelBase
from convmatrix.matrix import expand_matrix, load_matrix

FWD = Case("t", "fwd", width=4, dim=16, batch=2, seqlen=20)
UPDATE = Case("t", "update", width=4, dim=16, batch=2, tokens=1, steps=2, state_len=3)


def _case(base: Case, **changes) -> Case:
    return dataclasses.replace(base, id="", **changes)


def test_state_lens_are_relative_to_the_width():
    assert [str(s) for s in (STATE_LEN_ANY, STATE_LEN_K_MINUS_1, STATE_LEN_K)] == [
        "S >= K-1",
        "S == K-1",
        "S == K",
    ]
    assert str(StateLens(0, 3)) == "K-1 <= S <= K+2"
    for width in (2, 4):
        assert STATE_LEN_K.accepts(width, width) and not STATE_LEN_K.accepts(width, width - 1)
        assert STATE_LEN_K_MINUS_1.accepts(width, width - 1)
        assert not STATE_LEN_K_MINUS_1.accepts(width, width)
        assert STATE_LEN_ANY.accepts(width, width + 9)
    with pytest.raises(ValueError):
        StateLens(2, 1)


@pytest.mark.parametrize(
    ("caps", "case", "reason"),
    [
        (Capabilities(widths=frozenset({2, 3, 4})), _case(FWD, width=5), "width 5 not in"),
        (
            Capabilities(widths=frozenset({4}), update_widths=frozenset({4, 6})),
            _case(UPDATE, width=6, state_len=5),
            None,
        ),
        (
            Capabilities(widths=frozenset({4}), update_widths=frozenset({4, 6})),
            _case(UPDATE, width=5, state_len=4),
            "update width 5 not in [4, 6]",
        ),
        (
            Capabilities(widths=frozenset({4}), update_widths=frozenset({4, 6})),
            _case(FWD, width=6),
            "width 6 not in [4]",
        ),
        (Capabilities(state_lens=STATE_LEN_K), UPDATE, "needs S == K, got S=3 with K=4"),
        (Capabilities(state_lens=STATE_LEN_K), _case(UPDATE, state_len=4), None),
        (Capabilities(state_lens=STATE_LEN_K_MINUS_1), _case(UPDATE, state_len=5), "S == K-1"),
        (Capabilities(max_update_tokens=1), _case(UPDATE, tokens=2), "one token per call, got 2"),
        (Capabilities(max_update_tokens=4), _case(UPDATE, tokens=5), "at most 4 tokens"),
        (Capabilities(final_state="unpacked"), _case(FWD, final_state=True), None),
        (
            Capabilities(final_state="unpacked"),
            _case(FWD, final_state=True, seq_lens=(10, 10)),
            "without packing",
        ),
        (Capabilities(final_state="unpacked"), _case(FWD, seq_lens=(10, 10)), None),
        (
            Capabilities(final_state="per_sequence"),
            _case(FWD, final_state=True, seq_lens=(18, 2)),
            "shorter than K-1 (2 < 3 tokens)",
        ),
        (
            Capabilities(final_state="per_sequence"),
            _case(FWD, final_state=True, seq_lens=(17, 3)),
            None,
        ),
        (
            Capabilities(final_state="per_sequence"),
            _case(FWD, final_state=True, seq_lens=(20,)),
            None,
        ),
        # adjacent padding segments are one run of id -1: 1 + 2 tokens reach K-1 = 3
        (
            Capabilities(final_state="per_sequence"),
            _case(FWD, final_state=True, seq_lens=(17, -1, -2)),
            None,
        ),
        (
            Capabilities(final_state="per_sequence"),
            _case(FWD, final_state=True, seq_lens=(17, 1, -2)),
            "shorter than K-1 (2 < 3",
        ),
    ],
)
def test_each_field_rejects_exactly_its_cases(caps, case, reason):
    got = caps.contract_violation(case)
    assert got is None if reason is None else reason in got


def test_final_state_none_and_the_feature_say_the_same():
    none = Capabilities(final_state="none")
    assert "final_state" not in none.features
    assert Capabilities(features=FEATURES - {"final_state"}).final_state == "none"
    assert none.missing_features(_case(FWD, final_state=True)) == ["final_state"]
    assert none.contract_violation(_case(FWD, final_state=True, seq_lens=(19, 1))) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"final_state": "sometimes"},
        {"inplace_y": frozenset({"forward"})},
        {"max_update_tokens": 0},
    ],
)
def test_invalid_declarations_fail_at_construction(bad):
    with pytest.raises(ValueError):
        Capabilities(**bad)


class _HandRule(KernelBase):
    """Declares no backward, and by hand rejects batch 3 (a rule the fields cannot say)."""

    name = "hand"
    capabilities = Capabilities(features=FEATURES - {"backward"})

    def contract_violation(self, case: Case) -> str | None:
        return "batch 3 is refused" if case.batch == 3 else super().contract_violation(case)


def test_refusal_names_a_missing_feature_then_the_kernels_own_rules():
    kernel = _HandRule()
    assert refusal(kernel, _case(FWD, op="fwd_bwd")) == "kernel lacks feature(s) backward"
    assert refusal(kernel, _case(FWD, batch=3)) == "batch 3 is refused"
    assert refusal(kernel, FWD) is None


class _VllmLike(KernelBase):
    """vLLM's declared shape (convmatrix.kernels.adapters.vllm) without its library."""

    name = "vllm_like"
    capabilities = Capabilities(
        widths=frozenset({2, 3, 4}),
        update_widths=frozenset({2, 3, 4, 5, 6}),
        features=FEATURES - {"backward", "ring_buffer"},
        state_lens=STATE_LEN_K_MINUS_1,
        final_state="per_sequence",
    )


def _oracle(case: Case) -> bool:
    """Whether vLLM's contract rejects a nightly case, written from the fields' meaning."""
    if case.op == "update":
        return case.width not in range(2, 7) or case.state_len != case.width - 1
    if case.width not in (2, 3, 4):
        return True
    if case.final_state and case.seq_lens and len(case.seq_lens) > 1:
        last = case.seq_lens[-1]
        return abs(last) < case.width - 1 and not (last < 0 and case.seq_lens[-2] < 0)
    return False


def test_the_matrix_classifies_nightly_by_the_declared_fields():
    spec = load_matrix("nightly")
    plain = expand_matrix(spec).cases
    classified = expand_matrix(spec, _VllmLike()).cases
    assert [c.id for c in classified] == [c.id for c in plain]
    rejected = 0
    for before, after in zip(plain, classified, strict=True):
        if before.expect == "error":
            continue
        assert (after.expect == "error") == _oracle(before), after.expect_reason
        rejected += after.expect == "error"
    by_reason = {c.expect_reason.split(",")[0] for c in classified if c.expect_reason}
    assert rejected > 0
    assert any("S == K-1" in r for r in by_reason)
    assert any(c.op == "update" and c.expect == "ok" for c in classified)
