"""The three timing scopes: each times the computation it claims to.

The kernel scope's core (``core_call``) must compute what the public call computes, on the
same inputs: compared bit for bit where both run the same arithmetic in the same order (torch,
tiled: the core is the public call minus its conversions), and to the dtype's rounding where
the public call rounds a float64 result (reference). No assertion here is about time.
"""

from __future__ import annotations

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.builtin.tiled import TiledKernel
from convmatrix.kernels.interface.corecall import CoreArgs
from convmatrix.kernels.interface.protocol import KernelBase
from convmatrix.kernels.oracle.reference import ReferenceKernel
from convmatrix.matrix.spec import TimingSettings
from convmatrix.runners.case.inputs import build_forward, build_update
from convmatrix.runners.case.timing.cases import measure_interleaved, time_case
from convmatrix.runners.case.timing.measure import Sampling
from convmatrix.runners.case.timing.perfmodel import backward_work, work_of
from convmatrix.runners.case.timing.scopes import kernel_scopes, op_scopes
from convmatrix.runners.case.timing.subgraph import block_work, d_model, subgraph_scope

KERNELS = [TorchKernel(), ReferenceKernel(), TiledKernel(T=16, C_t=8, vec=4, P=2)]
ONE = Sampling(warmup_min=1, warmup_max=1, repeats_min=2, repeats_max=2, budget_s=0.0)


def _case(**kw) -> Case:
    base = dict(suite="t", op="fwd_bwd", width=4, dim=12, batch=2, seqlen=37,
                layout="channel_last", activation="silu", initial_state="random",
                final_state=True, dfinal="random")  # fmt: skip
    return Case(**{**base, **kw})


def _args(case: Case, op: str) -> tuple[CoreArgs, object]:
    fi = build_forward(case)
    args = CoreArgs(
        op=op, x=fi.x.view, weight=fi.weight.view, bias=fi.bias.view,
        activation=case.activation, initial_state=fi.initial_state.view,
        return_final_state=True, grad_y=fi.g, grad_final=fi.q,
    )  # fmt: skip
    return args, fi


def _public(kernel, case: Case, fi) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [fi.x.view, fi.weight.view, fi.bias.view, fi.initial_state.view]
    for t in leaves:
        t.requires_grad_(True)
    y, final = kernel.forward(
        *leaves[:3], initial_state=leaves[3], return_final_state=True, activation=case.activation
    )
    return y.detach(), list(torch.autograd.grad([y, final], leaves, [fi.g, fi.q]))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_core_forward_is_the_public_forward(kernel):
    case = _case(op="fwd")
    args, fi = _args(case, "fwd")
    out = kernel.core_call(args)()
    y = out[0] if isinstance(out, tuple | list) else out
    want = kernel.forward(
        fi.x.view, fi.weight.view, fi.bias.view, initial_state=fi.initial_state.view,
        activation=case.activation,
    )  # fmt: skip
    # The reference's core stops before the cast to the input dtype: cast it the same way.
    assert torch.equal(y.to(want.dtype), want)


@pytest.mark.parametrize("kernel", KERNELS[1:], ids=lambda k: k.name)
def test_core_backward_gives_the_public_gradients(kernel):
    """tiled and reference: the backward core returns (dx, dw, db, dS) exactly as autograd."""
    case = _case()
    args, _ = _args(case, "bwd")
    got = kernel.core_call(args)()
    _, want = _public(kernel, case, _args(case, "fwd")[1])
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.to(w.dtype), w)


def test_torch_core_backward_matches_autograd_of_the_public_call():
    """The torch core differentiates the padded input: its first K-1 columns are dS."""
    case = _case()
    args, _ = _args(case, "bwd")
    dxe, dw, db = TorchKernel().core_call(args)()
    _, (dx, dw_pub, db_pub, ds) = _public(TorchKernel(), case, _args(case, "fwd")[1])
    k = case.width
    # Same conv1d graph, but the public call pads with cat() and the core is pre-padded:
    # identical arithmetic, so equal to the last bit.
    assert torch.equal(dxe[..., k - 1 :], dx) and torch.equal(dxe[..., : k - 1], ds)
    assert torch.equal(dw.squeeze(1), dw_pub) and torch.equal(db, db_pub)


def test_kernel_without_a_core_is_timed_by_its_public_call_under_its_own_scope():
    class Plain(KernelBase):
        name = "plain"

        def forward(self, *args, **kwargs):
            return TorchKernel().forward(*args, **kwargs)

    case = _case()
    scopes = kernel_scopes(Plain(), case, build_forward(case))
    assert [s.scope for s in scopes] == ["kernel~op"]
    # packed input: the torch path has no single core call either
    packed = _case(seqlen=20, seq_lens=(9, 11))
    assert [s.scope for s in kernel_scopes(TorchKernel(), packed, build_forward(packed))] == [
        "kernel~op"
    ]


def test_forward_scopes_and_their_work():
    case = _case()
    tiled = KERNELS[2]
    kernel = kernel_scopes(tiled, case, build_forward(case))
    ops = op_scopes(tiled, case, build_forward(case))
    assert [(s.scope, s.work) for s in kernel] == [
        ("kernel", work_of(case)), ("kernel.bwd", backward_work(case))
    ]  # fmt: skip
    assert [(s.scope, s.work) for s in ops] == [
        ("op", work_of(case)),
        ("op.bwd", backward_work(case)),
    ]
    for s in kernel + ops:
        s.fn()


def _update_case(circular: bool) -> Case:
    return Case(suite="t", op="update", width=4, dim=8, batch=3, tokens=2, steps=1,
                state_len=5, circular=circular, slots="permuted")  # fmt: skip


@pytest.mark.parametrize("circular", [False, True])
def test_update_reset_restores_the_state_and_advance_moves_on(circular):
    case = _update_case(circular)
    ui = build_update(case)
    reset, advance = op_scopes(TiledKernel(), case, ui)
    assert (reset.mode, advance.mode) == ("reset", "advance")
    before = ui.pool.view.clone()
    reset.setup(), reset.fn()
    once = ui.pool.view.clone()
    assert not torch.equal(once, before)  # one decode step wrote the state
    for _ in range(3):
        reset.setup(), reset.fn()
        assert torch.equal(ui.pool.view, once)  # every repetition starts from the same state
    ui2 = build_update(case)
    _, advance = op_scopes(TiledKernel(), case, ui2)
    states = []
    for _ in range(3):
        advance.setup(), advance.fn()
        states.append(ui2.pool.view.clone())
    assert not torch.equal(states[0], states[1]) and not torch.equal(states[1], states[2])


def test_update_kernel_core_leaves_the_state_alone():
    case = _update_case(True)
    ui = build_update(case)
    (core,) = kernel_scopes(TiledKernel(), case, ui)
    before = ui.pool.view.clone()
    core.fn()
    assert core.scope == "kernel" and core.mode == "reset" and torch.equal(ui.pool.view, before)


@pytest.mark.parametrize("layout, contiguous_dim", [("channel_first", 2), ("channel_last", 1)])
def test_subgraph_splits_like_mamba_and_runs_forward_and_backward(layout, contiguous_dim):
    seen = []

    class Spy(TorchKernel):
        def forward(self, x, *args, **kwargs):
            seen.append(x.stride(contiguous_dim))
            return super().forward(x, *args, **kwargs)

    case = _case(layout=layout)
    timed = subgraph_scope(Spy(), case, build_forward(case))
    grads = timed.fn()
    assert seen == [1]  # Mamba1 (channel_first) or Mamba2 (channel_last) split of in_proj
    u_grad, w_in_grad, w_out_grad = grads[:3]
    assert u_grad.shape == (case.batch, case.seqlen, d_model(case))
    assert w_in_grad.shape == (2 * case.dim, d_model(case))
    assert w_out_grad.shape == (d_model(case), case.dim)
    assert timed.work == block_work(case)


def test_block_work_hand_checked():
    case = _case(op="fwd", dim=8, batch=2, seqlen=16, initial_state=None, final_state=False,
                 dfinal=None)  # fmt: skip
    # tokens N = 32, C = 8, d = 4, fp32 (4 B)
    # flops: in_proj 2*N*d*2C = 4096, out_proj 2*N*C*d = 2048, gate 5*N*C = 1280
    # bytes: in_proj (N*d + 2C*d + N*2C)*4 = (128+64+512)*4 = 2816; gate 3*N*C*4 = 3072;
    #        out_proj (N*C + C*d + N*d)*4 = (256+32+128)*4 = 1664
    extra = block_work(case) + type(work_of(case))(-work_of(case).flops, -work_of(case).bytes)
    assert (extra.flops, extra.bytes) == (4096 + 2048 + 1280, 2816 + 3072 + 1664)


def test_interleaved_rounds_alternate_and_satisfied_items_drop_out():
    from convmatrix.runners.case.timing.perfmodel import Work
    from convmatrix.runners.case.timing.scopes import Timed

    log: list[str] = []
    items = [Timed(name, (lambda n=name: log.append(n)), Work(0, 0)) for name in "ab"]
    sampling = Sampling(warmup_min=1, warmup_max=1, repeats_min=3, repeats_max=3, budget_s=0.0)
    results = measure_interleaved(items, torch.device("cpu"), sampling)
    # warm-up: a's cold call and one warm call, then b's; then three rounds a, b
    assert log == ["a", "a", "b", "b", "a", "b", "a", "b", "a", "b"]
    assert [(r.scope, r.n, len(r.samples)) for r in results] == [("a", 3, 3), ("b", 3, 3)]


def test_time_case_rows_carry_work_bounds_and_efficiency():
    case = _case(dim=8, seqlen=20)
    settings = TimingSettings(warmup=1, repeats=3, budget_s=0.001)
    rows = time_case(KERNELS[2], case, torch.device("cpu"), settings, TorchKernel())
    by = {(r.scope, r.mode): r for r in rows}
    assert set(by) == {(s, None) for s in ("kernel", "kernel.bwd", "op", "op.bwd", "subgraph",
                                             "framework", "memcpy", "fma", "gemm")}  # fmt: skip
    fma, gemm, copy = by[("fma", None)], by[("gemm", None)], by[("memcpy", None)]
    compute = fma.flops / fma.min_s
    dense = max(gemm.flops / gemm.min_s, compute)
    sub = by[("subgraph", None)]  # with dense layers: its flops bounded at the GEMM rate
    assert sub.floor_s >= sub.flops / dense and sub.efficiency == sub.floor_s / sub.median_s
    for scope in ("kernel", "op", "framework"):
        r = by[(scope, None)]
        assert (r.flops, r.bytes_moved) == (work_of(case).flops, work_of(case).bytes)
        # the memory term is the interleaved copy of the same D bytes
        assert r.floor_s == max(r.flops / compute, copy.median_s)
        assert r.efficiency == r.floor_s / r.median_s
        assert r.n >= 3 and r.cold_s is not None
    assert copy.bytes_moved >= work_of(case).bytes  # rounded up to whole 8-byte elements
