"""The ``vllm`` adapter on a machine without a GPU: availability, its declared contract, vLLM's
own Triton file (0.33.0, tests/resources/vllm-0.33.0) under the Triton interpreter, and the
stand-in of vLLM's API (convmatrix.kernels.doubles.vllm_standin) following the conventions read
in vLLM's source, with the adapter's translation against it.

vLLM's file runs in a fresh process (the interpreter flag must precede the first import of
Triton, and this process may hold a compiled Triton); it needs the declared component
``triton`` (the fla extra).

Numeric checks reuse test_tiled's judge: the (dtype, output) tolerance rows against the
float64 reference from the same rounded inputs (fp32: ~1.9e-6 relative); state copies bit for
bit (the update only moves values).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tiled import assert_matches, make_problem

from convmatrix.core.case import Case
from convmatrix.kernels import ContractError, load
from convmatrix.kernels.adapters import vllm_source
from convmatrix.kernels.adapters.vllm import NULL_BLOCK_ID, VllmKernel, _ops_of
from convmatrix.kernels.doubles.standins import vllm as standin
from convmatrix.kernels.doubles.vllm_standin import causal_conv1d_update
from convmatrix.kernels.oracle.reference import ReferenceKernel, reference_forward
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.case.execute import Context, run_case

REPO = Path(__file__).resolve().parents[1]
VENDORED = Path(__file__).parent / "resources" / "vllm-0.33.0"
RECORD_SHA256 = "UvVhiLKgjxIU2-cOBCNfsSYPlP-qritauPcvKBZD-tI"  # the wheel's RECORD


def test_without_a_gpu_or_a_vllm_source_it_says_why_and_refuses_calls(monkeypatch, tmp_path):
    if torch.cuda.is_available():  # a CUDA machine: vLLM itself decides
        pytest.skip("CUDA present: availability depends on the installed vllm")
    monkeypatch.delenv(vllm_source.ENV, raising=False)
    kernel = load("vllm")
    assert kernel.availability().startswith("no vLLM source: set CONVMATRIX_VLLM_SRC")
    with pytest.raises(ContractError, match="unavailable"):
        kernel.forward(torch.randn(1, 8, 4), torch.randn(8, 4))
    assert kernel.source_module == "vllm"
    monkeypatch.setenv(vllm_source.ENV, str(tmp_path))
    assert f"{tmp_path}: no {vllm_source.FILE} there" in load("vllm").availability()


@pytest.fixture(scope="session")
def vllm_tree(tmp_path_factory) -> Path:
    """The vendored file laid out as a vLLM source tree (tests/resources/vllm-0.33.0)."""
    source = (VENDORED / "causal_conv1d.py.vendored").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(source).digest()).rstrip(b"=").decode()
    assert digest == RECORD_SHA256, "the vendored file is not vLLM 0.33.0's"
    root = tmp_path_factory.mktemp("vllm-0.33.0")
    conv = root / vllm_source.FILE
    conv.parent.mkdir(parents=True)
    conv.write_bytes(source)
    utils = root / "vllm/v1/attention/backends/utils.py"
    utils.parent.mkdir(parents=True)
    shutil.copy(VENDORED / "backends_utils.py.vendored", utils)
    return root


def test_the_forward_loops_over_a_runtime_range(vllm_tree):
    """Why Triton 3.6's interpreter cannot run vLLM 0.33's forward (``range_tensor``): one
    loop, ``for idx_token in range(segment_len)``, bounded by a loaded value."""
    lines = vllm_source.runtime_range_loops(vllm_tree / vllm_source.FILE)
    text = (vllm_tree / vllm_source.FILE).read_text().splitlines()
    assert [text[n - 1].strip() for n in lines] == ["for idx_token in range(segment_len):"]


def test_signatures_of_each_vllm_version_are_followed():
    """vLLM 0.33 renamed the update's pad_slot_id to null_block_id and gave the forward a
    null_block_id (0 by default: the adapter's line 0 would be skipped); older vLLM has
    neither. The adapter follows the signature it finds."""

    class Old:
        def causal_conv1d_fn(x, w, b, states, loc, pad_slot_id=-1): ...
        def causal_conv1d_update(x, state, w, b=None, act=None, pad_slot_id=-1): ...

    class New:
        def causal_conv1d_fn(x, w, b, states, loc, pad_slot_id=-1, null_block_id=0): ...
        def causal_conv1d_update(x, state, w, b=None, act=None, null_block_id=0): ...

    old, new = _ops_of(Old, "vllm", {}), _ops_of(New, "vllm", {})
    assert old.pad_keyword == "pad_slot_id" and old.causal_conv1d_fn is Old.causal_conv1d_fn
    assert new.pad_keyword == "null_block_id"
    assert new.causal_conv1d_fn.keywords == {"null_block_id": -1}  # no line is the null block


INTERPRETED = """
import json, sys
from convmatrix.kernels import load
from convmatrix.kernels.adapters import triton_probes
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.case.execute import Context, run_case
kernel = load("vllm")
reason, facts = kernel.availability(), dict(kernel.describe())
bad, ops = [], set()
if reason is None:
    cases = [c for c in expand_matrix(load_matrix("nightly"), kernel).cases
             if c.op == "update" or c.op == "fwd"]
    for result in (run_case(c, Context(kernel)) for c in cases):
        if result.outcome == "passed" and result.case.expect == "ok":
            ops.add(result.case.op)
        elif result.outcome != "passed" and result.outcome != "skipped":
            bad.append(f"{result.case.pytest_id}: {result.message}")
print(json.dumps({"reason": reason, "facts": facts, "bad": bad, "ops": sorted(ops),
                  "range_tensor": triton_probes.range_tensor(),
                  "vllm_modules": [m for m in sys.modules if m.split(".")[0] == "vllm"]},
                 default=str))
"""


@pytest.mark.requires("triton")
def test_vllms_triton_file_runs_under_the_interpreter(vllm_tree):
    """vLLM 0.33.0's own kernels, no vLLM imported: every in-contract nightly forward and
    update passes (packed sequences with states, slots, rows on the null block, y into x),
    or, under a Triton whose interpreter cannot loop over a runtime range, the adapter says
    so instead of failing every case."""
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED], capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO), vllm_source.ENV: str(vllm_tree)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    facts = got["facts"]
    assert facts["vllm_source"] == str(vllm_tree / vllm_source.FILE)
    if got["range_tensor"]:
        assert "range(n) with n a runtime value" in got["reason"]
        return
    assert got["reason"] is None and got["bad"] == [] and got["ops"] == ["fwd", "update"]
    assert facts["interpreter"] and facts["pad_keyword"] == "null_block_id"
    assert facts["interpreter_workarounds"]["grid_meta"] == "worked around"
    assert got["vllm_modules"] == []  # the bridges are gone; nothing of vLLM was imported


def test_declared_contract():
    caps = standin().capabilities
    assert caps.widths == {2, 3, 4} and caps.update_widths == {2, 3, 4, 5, 6}
    assert {"backward", "ring_buffer"}.isdisjoint(caps.features)
    assert (str(caps.state_lens), caps.final_state) == ("S == K-1", "per_sequence")
    assert caps.inplace_y == {"update"} and caps.pad_slot_id == NULL_BLOCK_ID == 0
    assert load("convmatrix.kernels.adapters.vllm:pad_minus_one").capabilities.pad_slot_id == -1
    update = Case("t", "update", 5, 16, 2, tokens=3, steps=1, state_len=4)
    assert caps.contract_violation(update) is None  # width 5: the update's, not the forward's
    assert "S == K-1" in caps.contract_violation(dataclasses.replace(update, state_len=5))
    assert "width 5" in caps.contract_violation(Case("t", "fwd", 5, 16, 2, seqlen=9))


# -- the stand-in follows vLLM's update conventions ----------------------------------------


def test_standin_update_shifts_only_the_first_k_minus_1_columns_and_writes_y_into_x():
    gen = torch.Generator().manual_seed(0)
    dim, width, tokens = 8, 4, 2
    x = torch.randn(3, dim, tokens, generator=gen)
    w = torch.randn(dim, width, generator=gen)
    state = torch.randn(5, dim, width + 2, generator=gen)  # wider than K-1
    before = state.clone()
    x_in = x.clone()
    y = causal_conv1d_update(
        x_in, state, w, None, True, conv_state_indices=torch.tensor([4, -1, 0]), pad_slot_id=-1
    )
    assert y.data_ptr() == x_in.data_ptr()  # out = x
    assert torch.equal(y[1], x[1])  # the pad row's output is left as it was
    for row, line in ((0, 4), (2, 0)):
        history = before[line : line + 1, :, : width - 1]
        ref = reference_forward(
            x[row : row + 1].double(),
            w.double(),
            None,
            initial_state=history.double(),
            activation="silu",
        )
        # y is the float64 result rounded to fp32 once: |y - ref| <= 2^-24 |ref| (half an
        # ulp), under 3e-7 for |ref| <= 4.6 here (measured 2.3e-7); 1e-5 (and allclose's
        # rtol 1e-5) leaves 30x for the order of float64 sums. This test is about which state
        # columns are read and written: a wrong column gives O(1) errors.
        assert torch.allclose(y[row : row + 1].double(), ref, atol=1e-5)
        assert torch.equal(
            state[line, :, : width - 1],
            torch.cat([before[line, :, tokens : width - 1], x[row]], dim=1),
        )
        assert torch.equal(state[line, :, width - 1 :], before[line, :, width - 1 :])
    untouched = [1, 2, 3]
    assert torch.equal(state[untouched], before[untouched])
    with pytest.raises(ValueError, match="conv_state_indices is required"):
        causal_conv1d_update(x, state, w)


# -- the adapter's translation against the stand-in ----------------------------------------
# (its forward, shared with mlu_vllm, is checked in test_adapters.py for both ports)


@pytest.mark.parametrize("pad", [0, -1])
@pytest.mark.parametrize("width", [2, 4, 6])
@pytest.mark.parametrize(("tokens", "slots"), [(1, False), (3, False), (2, True)])
def test_update_matches_reference(pad, width, tokens, slots):
    kernel = VllmKernel(standin()._require(), pad_slot_id=pad)
    p = make_problem(3, 8, tokens, width, seed=6)
    pool = torch.randn(6, 8, width - 1, generator=torch.Generator().manual_seed(8))
    pool = pool if slots else pool[:3].clone()
    indices = torch.tensor([4, pad, 1], dtype=torch.int32) if slots else None
    canonical = None if indices is None else torch.where(indices == pad, -1, indices)
    pools = {"kernel": pool.clone(), "ref": pool.clone()}
    x = p["x"].clone()
    y = kernel.update(x, pools["kernel"], p["w"], p["b"], activation="silu", state_indices=indices)
    y_ref = ReferenceKernel().update(
        p["x"], pools["ref"], p["w"], p["b"], activation="silu", state_indices=canonical
    )
    assert_matches({"y": y}, {"y": y_ref.double()}, {"y": "float32"})
    assert torch.equal(pools["kernel"], pools["ref"])
    if slots:
        assert torch.equal(y[1], torch.zeros_like(y[1]))  # the padding row outputs 0


def test_update_refuses_what_it_declares_it_cannot_do():
    kernel = standin()
    p = make_problem(2, 8, 1, 4, seed=7)
    for state_len, match in ((4, "S == K-1"), (2, "state_len 2 < width-1")):
        with pytest.raises(ContractError, match=match):
            kernel.update(p["x"], torch.zeros(2, 8, state_len), p["w"])
    with pytest.raises(ContractError, match="cache_seqlens"):
        kernel.update(
            p["x"], torch.zeros(2, 8, 3), p["w"], cache_seqlens=torch.zeros(2, dtype=torch.int32)
        )
    with pytest.raises(ContractError, match="padding is 0"):
        kernel.update(p["x"], torch.zeros(3, 8, 3), p["w"], state_indices=torch.tensor([1, -1]))
    with pytest.raises(ContractError, match="width 7"):
        kernel.update(torch.randn(2, 8, 1), torch.zeros(2, 8, 6), torch.randn(8, 7))


def test_every_in_contract_nightly_case_without_backward_passes():
    """Updates (slots, pad rows on the null block, y into x) and packed forwards of nightly."""
    kernel = standin()
    cases = [
        c
        for c in expand_matrix(load_matrix("nightly"), kernel).cases
        if c.op == "update" or (c.op == "fwd" and c.seq_lens)
    ]
    results = [run_case(c, Context(kernel)) for c in cases]
    bad = [
        r.case.pytest_id + ": " + str(r.message)
        for r in results
        if r.outcome != "passed" and r.outcome != "skipped"
    ]
    assert not bad
    passed = {r.case.op for r in results if r.outcome == "passed" and r.case.expect == "ok"}
    assert passed == {"update", "fwd"}
    assert any(r.case.slots == "permuted_pad" and r.outcome == "passed" for r in results)
