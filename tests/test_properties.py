"""Property checks on the case's own work (runners.case.properties, chunks, agreement): the main
call is every check's whole call, the main reference's bounds judge them, and each check's
kernel calls are counted and stored."""

from __future__ import annotations

import sys

import pytest
import torch
from runner_helpers import TINY, convmatrix_cmd, results, run, runs

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.records import CaseResult, PropertyResult
from convmatrix.core.verdict import describe
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.oracle import reference
from convmatrix.runners.case.agreement import Agreement, Calls, PendingAgreement
from convmatrix.runners.case.execute import Context, build_inputs, run_case
from convmatrix.runners.case.reference import channel_blocks

CHECKS = ("causality", "packed_isolation", "chunk_consistency")
# Neither an initial state nor a final state: the chunks' F and the first chunk's call
# differ most from what the case itself asks for.
PACKED = Case("t", "fwd_bwd", 4, 12, 2, seqlen=19, activation="silu", seq_lens=(9, 10),
              checks=CHECKS)  # fmt: skip
# Several channel blocks of the reference (runners.case.reference.BLOCK_ELEMENTS): 3 blocks.
WIDE = Case("t", "fwd_bwd", 4, 130, 1, seqlen=4096, checks=("chunk_consistency",))


class Counting(TorchKernel):
    """The torch path, counting its forward calls."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0

    def forward(self, *args, **kwargs):
        self.forwards += 1
        return super().forward(*args, **kwargs)


def _props(result: CaseResult) -> dict[str, PropertyResult]:
    return {p.name: p for p in result.properties}


def _calls(result: CaseResult) -> dict[str, tuple[int | None, int | None]]:
    return {p.name: (p.forward_calls, p.backward_calls) for p in result.properties}


@pytest.mark.parametrize("op", ["fwd", "fwd_bwd"])
def test_each_check_makes_only_its_own_calls_and_records_them(op):
    """Before: causality and packed isolation called the forward twice each (a 'before' the
    main call already had), chunk consistency a whole call and two chunks (8 forwards). On
    a packed case the two share one changed forward (causality's)."""
    kernel = Counting()
    result = run_case(Case(**{**PACKED.__dict__, "id": "", "op": op}), Context(kernel))
    assert result.outcome == "passed", describe(result)
    backward = 2 if op == "fwd_bwd" else 0
    assert _calls(result) == {
        "guards": (0, 0),
        "causality": (1, 0),
        "packed_isolation": (0, 0),
        "chunk_consistency": (2, backward),
    }
    assert kernel.forwards == 1 + 1 + 2  # the main call and the checks' calls


def _reference_calls(case: Case) -> list[int]:
    """The length of x each time the float64 forward reference runs during ``run_case``."""
    code, lengths = reference.conv_forward.__code__, []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            lengths.append(frame.f_locals["x"].shape[-1])

    sys.setprofile(profile)
    try:
        result = run_case(case, Context(TorchKernel()))
    finally:
        sys.setprofile(None)
    assert result.outcome == "passed", describe(result)
    assert _props(result)["chunk_consistency"].detail.startswith("split at")
    return lengths


@pytest.mark.parametrize("c", [PACKED, WIDE], ids=["one-block", "three-blocks"])
def test_the_checks_compute_no_whole_reference_of_their_own(c):
    """Chunk consistency computed a second whole-tensor float64 reference (1.63 s of a
    7.5 s production case); now the main reference's blocks are the only whole ones, and
    the initial state's gradient (which the case does not ask for) is judged from its
    first K-1 tokens."""
    blocks = channel_blocks(c, build_inputs(c, torch.device("cpu")))
    lengths = _reference_calls(c)
    assert sorted(lengths) == [c.width - 1] + [c.seqlen] * len(blocks)


class LastChannelDriftInChunks(TorchKernel):
    """Correct on every call but those with an initial state (the chunks of a case that has
    none): there the last channel's last y is off by 1e-3, far over its bound."""

    name = "last_channel_drift"

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        if kwargs.get("initial_state") is None:
            return out
        y, final = out if isinstance(out, tuple) else (out, None)
        y = y.clone()
        y[:, -1, -1] += 1e-3
        return (y, final) if final is not None else y


def test_chunk_consistency_judges_every_block_and_names_the_channel():
    result = run_case(WIDE, Context(LastChannelDriftInChunks()))
    assert all(o.passed for o in result.outputs)  # the main call is right
    chunk = _props(result)["chunk_consistency"]
    assert not chunk.passed and "y differs by" in chunk.detail, chunk.detail
    assert "at [0, 129, " in chunk.detail, chunk.detail  # in the third block


class FutureLeak(TorchKernel):
    """y[t] moves by 1e-2 when x[t+1] > 0, and says its forward is nondeterministic: judged
    by the bound rather than bit for bit, and 1e-2 is over any bound here."""

    name = "future_leak"
    capabilities = Capabilities(intermediate="input", deterministic=False)

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        ahead = torch.zeros_like(y)
        ahead[..., :-1] = (x[..., 1:] > 0).to(y.dtype) * 1e-2
        return (y + ahead, out[1]) if isinstance(out, tuple) else y + ahead


def test_a_nondeterministic_kernel_that_leaks_over_the_bound_fails_causality():
    causality = _props(run_case(PACKED, Context(FutureLeak())))["causality"]
    assert not causality.passed and "y differs by" in causality.detail, causality
    assert "bounds (allowed" in causality.detail and "at [" in causality.detail


def test_a_comparison_the_reference_never_reached_is_a_harness_error_not_a_pass():
    y = torch.zeros(1, 2, 3)
    pending = PendingAgreement(Calls(), "ok", [Agreement("chunks", "dS", y, y, 2.0)])
    with pytest.raises(RuntimeError, match="dS never judged"):
        pending.finish("chunk_consistency")


class WritesOutsideOnChunks(TorchKernel):
    """Writes into the storage just before x's view on a call shorter than the case (the
    chunks): the main call's inputs, which the checks reuse, are damaged."""

    name = "writes_outside_on_chunks"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] < 19 and x.storage_offset() > 0:
            with torch.no_grad():
                x.detach().as_strided((1,), (1,), x.storage_offset() - 1).fill_(0.0)
        return super().forward(x, weight, bias, **kwargs)


def test_damage_by_one_checks_calls_fails_that_check_alone_and_is_repaired():
    """chunk consistency runs first here: its calls break x's guard band; causality, after
    it, runs on repaired inputs and passes."""
    c = Case(**{**PACKED.__dict__, "id": "", "gap": "row_pad",
                "checks": ("chunk_consistency", "causality")})  # fmt: skip
    result = run_case(c, Context(WritesOutsideOnChunks()))
    props = _props(result)
    assert props["guards"].passed and props["causality"].passed, props
    chunk = props["chunk_consistency"]
    assert not chunk.passed and chunk.detail.startswith("guards broken by this check's calls")


class SeesX(TorchKernel):
    """Keeps what each forward call received as x: its values, strides and storage."""

    name = "sees_x"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.Tensor, tuple[int, ...], int]] = []

    def forward(self, x, *args, **kwargs):
        self.seen.append((x.detach().clone(), x.stride(), x.data_ptr()))
        return super().forward(x, *args, **kwargs)


class WritesXOnSecondCall(TorchKernel):
    name = "writes_x_once"
    calls = 0

    def forward(self, x, *args, **kwargs):
        self.calls += 1
        if self.calls == 2:
            with torch.no_grad():
                x[..., 0] = 0.0
        return super().forward(x, *args, **kwargs)


@pytest.mark.parametrize(
    "layout, gap",
    [("channel_first", None), ("channel_last", "channel_slice"), ("channel_first", "row_pad")],
)
def test_the_changed_forward_negates_x_where_it_lies_and_puts_it_back(layout, gap):
    c = Case("t", "fwd", 4, 12, 2, seqlen=19, layout=layout, gap=gap, checks=("causality",))
    kernel = SeesX()
    result = run_case(c, Context(kernel))
    assert _props(result)["guards"].passed and _props(result)["causality"].passed
    (main_x, stride, ptr), (changed_x, changed_stride, changed_ptr) = kernel.seen
    cut = c.seqlen // 2  # y[:cut+1] kept, x[cut+1:] changed
    expected = main_x.clone()
    expected[..., cut + 1 :] = -expected[..., cut + 1 :]
    assert torch.equal(changed_x, expected)
    assert (changed_stride, changed_ptr) == (stride, ptr)  # the case's own placement
    # put back bit for bit: the guards after the check found x as placed (asserted above)


def test_a_write_into_x_on_the_changed_call_fails_that_check_and_is_repaired():
    c = Case("t", "fwd", 4, 12, 2, seqlen=19, checks=("causality", "chunk_consistency"))
    props = _props(run_case(c, Context(WritesXOnSecondCall())))
    assert props["guards"].passed and props["chunk_consistency"].passed
    detail = props["causality"].detail
    assert not props["causality"].passed and detail.startswith("guards broken by this check's")
    # x[..., 0] of every row (2 x 12) written
    assert "x: 24 element(s) modified (first at [0, 0, 0])" in detail


def test_the_calls_are_stored_and_read_back(tmp_path, sqlite_url):
    done = run(convmatrix_cmd("run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0",
                              "--db", sqlite_url), tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = runs(sqlite_url)
    stored = [r for r in results(sqlite_url, info.id) if r.case.op == "fwd_bwd"]
    assert stored
    for r in stored:
        assert _calls(r)["causality"] == (1, 0) and _calls(r)["chunk_consistency"] == (2, 2)
        assert CaseResult.from_json(r.to_json()).properties == r.properties


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.bool])
@pytest.mark.parametrize(
    "shape, order", [((1, 8, 6), (0, 2, 1)), ((2, 8, 6), (0, 2, 1)), ((2, 6, 8), (0, 1, 2))]
)
def test_same_bits_compares_time_spans_of_either_layout(dtype, shape, order):
    """The fast comparison of the checks (words in memory order) against torch.equal, on
    spans of channel-last and channel-first outputs: one changed element at time step 2."""
    from convmatrix.runners.case.guards import same_bits

    a = (torch.randn(shape) * 3).to(dtype).permute(order)
    b = torch.empty_strided(a.shape, a.stride(), dtype=dtype).copy_(a)
    b[0, 1, 2] = ~b[0, 1, 2] if dtype == torch.bool else b[0, 1, 2] + 1
    for start, stop in [(0, a.shape[-1]), (1, 3), (2, 5), (3, a.shape[-1])]:
        span = (a[..., start:stop], b[..., start:stop])
        assert same_bits(*span) == torch.equal(*span) == (not start <= 2 < stop)
