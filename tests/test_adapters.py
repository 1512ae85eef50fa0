"""Device adapters on a machine without their libraries: availability, Dao's contract as data,
and the MLU adapters' translation run against in-project implementations of the same APIs.

Numeric checks reuse test_tiled's judge: the matrix's (dtype, output) tolerance rows against
the float64 reference from the same rounded inputs (fp32: ~1.9e-6 relative).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tiled import _seq_idx, assert_matches, channel_last, make_problem

from convmatrix.core.case import Case
from convmatrix.kernels import ContractError, list_kernels, load
from convmatrix.kernels.adapters.dao import DaoKernel, _state_layout, dao_contract
from convmatrix.kernels.adapters.mlu_fla import MluFlaKernel
from convmatrix.kernels.adapters.mlu_ops import MluOps
from convmatrix.kernels.adapters.mlu_vllm import MluVllmKernel
from convmatrix.kernels.doubles.mlu_standin import STANDIN_OPS, causal_conv1d, causal_conv1d_fn
from convmatrix.kernels.oracle.reference import ReferenceKernel, reference_forward

# -- availability -------------------------------------------------------------------------


def test_adapters_report_unavailability_cleanly():
    status = {info.name: info.status for info in list_kernels()}
    for name in ("reference", "torch", "tiled", "dao", "mlu_vllm", "mlu_fla"):
        assert name in status
    for name, library in (("dao", "causal_conv1d"), ("mlu_vllm", "torch_mlu_ops")):
        kernel = load(name)
        reason = kernel.availability()
        if reason is not None:  # a machine with the library and a device would say None
            assert status[name] == f"unavailable: {reason}"
            assert library in reason or "device" in reason
            with pytest.raises(ContractError, match="unavailable"):
                kernel.forward(torch.randn(1, 8, 4), torch.randn(8, 4))


# -- Dao's contract, checked on Case values -----------------------------------------------

BASE = Case(suite="t", op="fwd_bwd", width=4, dim=64, batch=2, seqlen=80, layout="channel_last")


def _case(**changes) -> Case:
    return dataclasses.replace(BASE, id="", **changes)


@pytest.mark.parametrize(
    ("changes", "version", "reason"),
    [
        ({}, (1, 7, 0), None),
        ({"width": 5}, (1, 7, 0), "width 5 not in [2, 3, 4]"),
        ({"dim": 60}, (1, 7, 0), "dim % 8 == 0"),
        ({"dim": 64, "gap": "channel_slice"}, (1, 7, 0), None),  # runner gaps keep 8-multiples
        ({"layout": "channel_first", "dim": 60}, (1, 7, 0), None),  # no alignment rule there
        ({"layout": "channel_first", "initial_state": "zeros"}, (1, 7, 0), "channel-last"),
        ({"layout": "channel_first", "final_state": True}, (1, 7, 0), "channel-last"),
        ({"layout": "channel_first", "seq_lens": (40, 40)}, (1, 7, 0), "channel-last"),
        ({"seq_lens": (40, 40), "initial_state": "random"}, (1, 6, 2), ">= 1.7.0"),
        ({"seq_lens": (40, 40), "initial_state": "random"}, (1, 7, 0), None),
        ({"seq_lens": (40, 40), "final_state": True}, (1, 7, 0), "without packing"),
        ({"op": "fwd", "seq_lens": (40, -8, 32)}, (1, 5, 2), ">= 1.5.3"),
        ({"op": "fwd", "seq_lens": (40, -8, 32)}, (1, 5, 3), None),
        ({"seq_lens": (40, -8, 32)}, (1, 6, 0), "backward through padding"),
        ({"seq_lens": (40, -8, 32)}, (1, 7, 0), None),
    ],
)
def test_dao_forward_contract(changes, version, reason):
    got = dao_contract(_case(**changes), version)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_dao_update_contract_depends_on_the_installed_signature():
    update = _case(op="update", seqlen=None, tokens=2, steps=1, state_len=4)
    assert dao_contract(update, (1, 7, 0)) is None
    assert "one token" in dao_contract(update, (1, 0, 0), legacy=True)
    one = dataclasses.replace(update, id="", tokens=1, circular=True)
    assert "cache_seqlens" in dao_contract(one, (1, 0, 0), legacy=True)
    pad = dataclasses.replace(update, id="", slots="permuted_pad")
    assert ">= 1.5.3" in dao_contract(pad, (1, 5, 2)) and dao_contract(pad, (1, 5, 3)) is None


def test_dao_kernel_classifies_cases_and_declares_its_chunks():
    kernel = DaoKernel(version="1.6.2")
    assert (
        kernel.contract_violation(_case(x_dtype="float16", width=8)) == "width 8 not in [2, 3, 4]"
    )
    assert ">= 1.7.0" in kernel.contract_violation(_case(seq_lens=(40, 40), initial_state="random"))
    assert kernel.capabilities.geometry.symbols() == {"tile": 64, "ctile": 64, "vec": 8}
    assert (
        load("convmatrix.kernels.adapters.dao:channel_first").capabilities.geometry.time_tile
        == 1024
    )


def test_dao_state_layout_keeps_values_and_gradients():
    state = torch.randn(2, 16, 3, requires_grad=True)
    laid = _state_layout(state)
    assert laid.stride(1) == 1 and torch.equal(laid, state)
    laid.sum().backward()
    assert torch.equal(state.grad, torch.ones_like(state))
    already = torch.randn(2, 3, 16).transpose(1, 2)
    assert _state_layout(already) is already


# -- the stand-ins follow the published conventions ----------------------------------------


def test_vllm_api_reads_and_writes_only_the_first_k_minus_1_columns():
    gen = torch.Generator().manual_seed(0)
    dim, width = 8, 3
    x = torch.randn(9, dim, generator=gen).t()  # (dim, tokens), token-major
    w, b = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.randn(2, width + 3, dim, generator=gen).transpose(1, 2)  # wider than K-1
    states[:, :, width - 1 :] = float("nan")  # columns the API must neither read nor write
    qsl = torch.tensor([0, 4, 9], dtype=torch.int32)
    prior = states[:, :, : width - 1].clone()
    out = causal_conv1d_fn(
        x, w, b, states, qsl, has_initial_state=torch.tensor([True, False]), activation=None
    )
    first = reference_forward(x[None, :, :4], w, b, initial_state=prior[0:1])[0]
    second = reference_forward(x[None, :, 4:], w, b)[0]
    # The stand-in is the float64 reference rounded to fp32 once, like .float() here: equal
    # (measured: 0), or one fp32 ulp apart if the two float64 sums round differently; one ulp
    # of |y| < 8 (here |y| <= 4.6) is at most 2^-23 * 8 ~ 9.5e-7 <= 1e-6. A state column read
    # from the wrong place (NaN or another value) is O(1).
    assert torch.allclose(out, torch.cat([first, second], 1).float(), atol=1e-6, rtol=0)
    assert torch.isnan(states[:, :, width - 1 :]).all()
    assert torch.equal(states[1, :, : width - 1], x[:, -(width - 1) :])
    with pytest.raises(ValueError, match="less than or equal to 4"):
        causal_conv1d_fn(x, torch.randn(dim, 5), None, states, qsl)
    with pytest.raises(AssertionError):  # a (lines, dim, W) state with time stride 1
        causal_conv1d_fn(x, w, b, torch.zeros(2, dim, width - 1), qsl)


def test_fla_api_reads_the_last_w_minus_1_state_columns():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 8, generator=gen)  # (B, T, D)
    w = torch.randn(8, 4, generator=gen)
    state = torch.randn(2, 8, 4, generator=gen)
    state[:, :, 0] = float("nan")  # column 0 is never read
    y, final = causal_conv1d(x, w, None, initial_state=state, activation="silu")
    ref = reference_forward(x.transpose(1, 2), w, initial_state=state[:, :, 1:], activation="silu")
    # As above: the float64 reference rounded once, against the same rounded (measured: 0);
    # 1e-6 is one fp32 ulp of |y| < 8 (here |y| <= 6.6)
    assert final is None and torch.allclose(y, ref.transpose(1, 2).float(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="output_final_state"):
        causal_conv1d(x, w, output_final_state=True)


# -- the adapters' translation against the stand-ins ---------------------------------------


def _recording(log: list) -> MluOps:
    """The stand-in ops, recording what the adapter hands them."""

    def fn(x, weight, bias, conv_states, query_start_loc, **kw):
        log.append(("fn", x.stride(), query_start_loc.tolist(), kw["has_initial_state"].tolist()))
        return STANDIN_OPS.causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, **kw)

    def fla(x, weight, bias, **kw):
        cu = kw.get("cu_seqlens")
        log.append(("fla", tuple(x.shape), None if cu is None else cu.tolist()))
        return STANDIN_OPS.causal_conv1d(x, weight, bias, **kw)

    return MluOps(fn, fla, STANDIN_OPS.causal_conv1d_update, label="standin")


def test_vllm_adapter_builds_token_major_x_and_query_start_loc():
    log: list = []
    kernel = MluVllmKernel(_recording(log))
    p = make_problem(2, 8, 16, 4, seed=2)
    seq_idx = _seq_idx(2, (5, -2, 9))
    y, final = kernel.forward(
        p["x"],
        p["w"],
        p["b"],
        initial_state=p["s"],
        seq_idx=seq_idx,
        return_final_state=True,
        activation="silu",
    )
    _, stride, qsl, has_state = log[0]
    assert stride[0] == 1  # (dim, tokens) with the dim stride 1
    # Row 0: [0,5) [5,7) padding [7,16); row 1 the same, 16 tokens later.
    assert qsl == [0, 5, 7, 16, 21, 23, 32]
    assert has_state == [True, False, False, True, False, False]
    ref_y, ref_f = reference_forward(
        p["x"].double(),
        p["w"].double(),
        p["b"].double(),
        initial_state=p["s"].double(),
        seq_idx=seq_idx,
        return_final_state=True,
        activation="silu",
    )
    assert_matches({"y": y, "F": final}, {"y": ref_y, "F": ref_f}, {"y": "float32", "F": "float32"})


def test_fla_adapter_builds_cu_seqlens_and_wide_states():
    log: list = []
    kernel = MluFlaKernel(_recording(log))
    p = make_problem(2, 8, 16, 3, seed=3)
    kernel.forward(p["x"], p["w"], p["b"], initial_state=p["s"], seq_idx=_seq_idx(2, (6, 10)))
    assert log[0] == ("fla", (1, 32, 8), [0, 6, 16, 22, 32])
    kernel.forward(p["x"], p["w"], p["b"], initial_state=p["s"])
    assert log[1] == ("fla", (2, 16, 8), None)


@pytest.mark.parametrize("spec", ["mlu_vllm", "vllm"])  # one API, two ports
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("lens", [None, (5, 11, 17), (7, -3, 23), (-4, 29)])
def test_vllm_adapter_forward_matches_reference(spec, layout, dtype, lens):
    kernel = load(f"convmatrix.kernels.doubles.standins:{spec}")
    p = make_problem(2, 16, 33, 4, seed=4, x_dtype=dtype)
    seq_idx = None if lens is None else _seq_idx(2, lens)
    x = channel_last(p["x"]) if layout == "channel_last" else p["x"]
    final_ok = lens is None or abs(lens[-1]) >= 3
    args = dict(initial_state=p["s"], seq_idx=seq_idx, activation="silu")
    if not final_ok:
        with pytest.raises(ContractError, match="shorter than K-1"):
            kernel.forward(x, p["w"], p["b"], return_final_state=True, **args)
        return
    y, final = kernel.forward(x, p["w"], p["b"], return_final_state=True, **args)
    ref = {k: v.double() for k, v in p.items()}
    ref_y, ref_f = reference_forward(
        ref["x"],
        ref["w"],
        ref["b"],
        initial_state=ref["s"],
        seq_idx=seq_idx,
        return_final_state=True,
        activation="silu",
    )
    assert y.dtype == p["x"].dtype and final.dtype == p["x"].dtype
    assert_matches({"y": y, "F": final}, {"y": ref_y, "F": ref_f}, {"y": dtype, "F": dtype})


def test_vllm_adapter_contract():
    kernel = load("convmatrix.kernels.doubles.standins:mlu_vllm")
    assert kernel.availability() is None
    assert "backward" not in kernel.capabilities.features
    short = _case(op="fwd", seq_lens=(70, 10), final_state=True, width=4)
    assert kernel.contract_violation(short) is None
    assert "shorter than K-1" in kernel.contract_violation(
        dataclasses.replace(short, id="", seq_lens=(78, 2))
    )
    with pytest.raises(ContractError, match="width 5"):
        kernel.forward(torch.randn(1, 8, 6), torch.randn(8, 5))


@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("lens", [None, (5, 11, 17), (7, -3, 23)])
def test_fla_adapter_forward_backward_matches_reference(layout, dtype, lens):
    kernel = load("convmatrix.kernels.doubles.standins:mlu_fla")
    p = make_problem(2, 16, 33, 4, seed=5, x_dtype=dtype)
    seq_idx = None if lens is None else _seq_idx(2, lens)

    def run(fn, cast):
        leaves = {k: p[k] if cast is None else p[k].to(cast) for k in ("x", "w", "b", "s")}
        if layout == "channel_last":
            leaves["x"] = channel_last(leaves["x"])
        leaves = {k: v.detach().requires_grad_(True) for k, v in leaves.items()}
        y = fn(
            leaves["x"],
            leaves["w"],
            leaves["b"],
            initial_state=leaves["s"],
            seq_idx=seq_idx,
            activation="silu",
        )
        (y * p["g"].to(y.dtype)).sum().backward()
        return {
            "y": y,
            "dx": leaves["x"].grad,
            "dw": leaves["w"].grad,
            "db": leaves["b"].grad,
            "dS": leaves["s"].grad,
        }

    got, ref = run(kernel.forward, None), run(reference_forward, torch.float64)
    dtypes = {"y": dtype, "dx": dtype, "dS": dtype, "dw": "float32", "db": "float32"}
    assert_matches(got, ref, dtypes)


def test_fla_adapter_has_no_final_state():
    kernel = load("convmatrix.kernels.doubles.standins:mlu_fla")
    assert "final_state" not in kernel.capabilities.features
    with pytest.raises(ContractError, match="final state"):
        kernel.forward(torch.randn(1, 8, 6), torch.randn(8, 4), return_final_state=True)


@pytest.mark.parametrize("name", ["mlu_vllm", "mlu_fla"])
@pytest.mark.parametrize(
    ("tokens", "state_len", "ring", "slots"),
    [(1, 3, False, False), (3, 6, False, False), (4, 5, True, False), (2, 5, True, True)],
)
def test_mlu_adapter_updates_match_reference(name, tokens, state_len, ring, slots):
    kernel = load(f"convmatrix.kernels.doubles.standins:{name}")
    p = make_problem(3, 8, tokens, 4, seed=6)
    pool = torch.randn(5 if slots else 3, 8, state_len, generator=torch.Generator().manual_seed(8))
    indices = torch.tensor([4, -1, 0], dtype=torch.int32) if slots else None
    seqlens = torch.tensor([state_len - 1, 0, 2 * state_len + 1], dtype=torch.int32)
    seqlens = seqlens if ring else None
    pools = {"kernel": pool.clone(), "ref": pool.clone()}
    args = dict(activation="silu", cache_seqlens=seqlens, state_indices=indices)
    y = kernel.update(p["x"], pools["kernel"], p["w"], p["b"], **args)
    y_ref = ReferenceKernel().update(p["x"], pools["ref"], p["w"], p["b"], **args)
    assert_matches({"y": y}, {"y": y_ref.double()}, {"y": "float32"})
    assert torch.equal(pools["kernel"], pools["ref"])


# -- the example plugin package -----------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mlu_kernel_plugin"

_PROBE = """
import torch
from convmatrix.kernels import load
from convmatrix.kernels.oracle.reference import reference_forward
k = load("my_mlu")
gen = torch.Generator().manual_seed(0)
x, w, b, s = (torch.randn(*sh, generator=gen) for sh in ((2, 8, 20), (8, 4), (8,), (2, 8, 3)))
y = k.forward(x, w, b, initial_state=s, activation="silu")
r = reference_forward(*(t.double() for t in (x, w, b)), initial_state=s.double(), activation="silu")
print(k.describe()["implementation"], float((y.double() - r).abs().max()))
"""


@pytest.mark.slow
def test_example_plugin_registers_through_the_entry_point_group(tmp_path):
    """pip-install the example (from a copy, so no build files land in the checkout) into a
    target directory and use it from fresh interpreters that only see it on PYTHONPATH."""
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*pip, "--no-build-isolation", "--target", str(site), str(source)], check=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    listed = subprocess.run(
        [sys.executable, "-m", "convmatrix", "kernels"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(row for row in listed.splitlines() if row.startswith("my_mlu "))
    assert "available" in line and "unavailable" not in line
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    # The portable implementation sums K=4 taps in FP32: ~1e-6 against float64 on O(1) data.
    assert probe[0] == "portable" and float(probe[-1]) < 1e-5
