"""The float64 oracle: explicit backward vs autograd, properties, packed sequences, updates."""

from __future__ import annotations

import pytest
import torch

from convmatrix.kernels import ContractError
from convmatrix.kernels.oracle.reference import ReferenceKernel, conv_forward, reference_forward
from convmatrix.kernels.oracle.selfcheck import run_selfcheck, vectorised_vs_scalar

F64 = torch.float64


def _rand(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def _problem(seed=0, batch=2, dim=3, seqlen=11, width=4):
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": _rand(gen, batch, dim, seqlen),
        "w": _rand(gen, dim, width),
        "b": _rand(gen, dim),
        "s": _rand(gen, batch, dim, width - 1),
        "g": _rand(gen, batch, dim, seqlen),
        "q": _rand(gen, batch, dim, width - 1),
    }


def _grads(fn, p, seq_idx=None, activation="silu"):
    """y, F and the gradients of <g,y> + <q,F> w.r.t. x, weight, bias, initial state."""
    leaves = {k: p[k].clone().requires_grad_(True) for k in ("x", "w", "b", "s")}
    y, final = fn(leaves, seq_idx, activation)
    ((y * p["g"]).sum() + (final * p["q"]).sum()).backward()
    return [y.detach(), final.detach()] + [leaves[k].grad for k in ("x", "w", "b", "s")]


def _explicit(v, seq_idx, act):
    return reference_forward(
        v["x"],
        v["w"],
        v["b"],
        initial_state=v["s"],
        seq_idx=seq_idx,
        return_final_state=True,
        activation=act,
    )


def _autograd(v, seq_idx, act):
    # conv_forward is built from differentiable torch ops; autograd through it is independent
    # of the hand-written conv_backward that reference_forward uses.
    y, final, _ = conv_forward(v["x"], v["w"], v["b"], v["s"], seq_idx, act)
    return y, final


PACKED = torch.tensor([[0, 0, 0, 1, 1, 1, 1, -1, 2, 2, 2], [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]])


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("seq_idx", [None, PACKED], ids=["dense", "packed"])
@pytest.mark.parametrize("width", [1, 2, 4])
def test_explicit_backward_matches_autograd(activation, seq_idx, width):
    # Both are float64 evaluations of the same sums in different orders: agreement to 1e-12
    # (~5000 ulps at these magnitudes) rules out any indexing error, which is O(1).
    p = _problem(width=width)
    explicit = _grads(_explicit, p, seq_idx, activation)
    auto = _grads(_autograd, p, seq_idx, activation)
    for name, a, b in zip(("y", "F", "dx", "dw", "db", "dS"), explicit, auto, strict=True):
        assert torch.allclose(a, b, atol=1e-12, rtol=0), name


def test_selfcheck_passes_and_scalar_agrees():
    results = run_selfcheck()
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert vectorised_vs_scalar(cases=30).error <= 1e-12


@pytest.mark.parametrize("t", [0, 4, 9])
def test_causality_future_inputs_do_not_change_past_outputs(t):
    p = _problem(seed=1)
    y = reference_forward(p["x"], p["w"], p["b"], initial_state=p["s"], activation="silu")
    x2 = p["x"].clone()
    x2[:, :, t + 1 :] = torch.randn_like(x2[:, :, t + 1 :]) * 100
    y2 = reference_forward(x2, p["w"], p["b"], initial_state=p["s"], activation="silu")
    assert torch.equal(y[:, :, : t + 1], y2[:, :, : t + 1])  # bit-identical
    assert not torch.equal(y[:, :, t + 1 :], y2[:, :, t + 1 :])  # the check can see a change


def test_packed_isolation_outputs_and_gradients_bit_identical():
    p = _problem(seed=2)
    seq_idx = PACKED[:1].expand(2, -1).contiguous()
    base = _grads(_explicit, p, seq_idx)
    p2 = dict(p)
    p2["x"] = p["x"].clone()
    p2["x"][:, :, 3:7] += 5.0  # the second sample (seq id 1)
    changed = _grads(_explicit, p2, seq_idx)
    later = slice(8, 11)  # the third sample (seq id 2) must not see the second
    assert torch.equal(base[0][:, :, later], changed[0][:, :, later])
    assert torch.equal(base[2][:, :, later], changed[2][:, :, later])
    assert not torch.equal(base[0][:, :, 3:7], changed[0][:, :, 3:7])


def test_padding_tokens_output_zero_and_feed_nothing():
    p = _problem(seed=3)
    seq_idx = PACKED
    y = reference_forward(p["x"], p["w"], p["b"], initial_state=p["s"], seq_idx=seq_idx)
    assert torch.equal(y[0, :, 7], torch.zeros(3, dtype=F64))
    x2 = p["x"].clone()
    x2[0, :, 7] = 1e6
    y2 = reference_forward(x2, p["w"], p["b"], initial_state=p["s"], seq_idx=seq_idx)
    assert torch.equal(y, y2)


def test_packed_equals_separate_calls_and_state_feeds_first_sequence():
    # Each packed sample must equal an independent call on that sample alone; the initial
    # state belongs to the row's first sequence, later sequences start from zeros.
    p = _problem(seed=4, batch=1)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]])
    y = reference_forward(p["x"], p["w"], p["b"], initial_state=p["s"], seq_idx=seq_idx)
    bounds = [(0, 3, p["s"]), (3, 8, None), (8, 11, None)]
    for start, stop, state in bounds:
        alone = reference_forward(p["x"][:, :, start:stop], p["w"], p["b"], initial_state=state)
        assert torch.allclose(y[:, :, start:stop], alone, atol=1e-14, rtol=0)


def test_short_chunk_final_state_comes_partly_from_initial_state():
    p = _problem(seed=5, seqlen=2, width=4)  # L=2 < K-1=3
    _, final = reference_forward(
        p["x"], p["w"], p["b"], initial_state=p["s"], return_final_state=True
    )
    expected = torch.cat([p["s"][:, :, 2:], p["x"]], dim=2)
    assert torch.equal(final, expected)


def _history_forward(p, steps_x, state0):
    """Reference y of the whole history (state0 then all tokens), last tokens only."""
    full = torch.cat(steps_x, dim=2)
    y = reference_forward(full, p["w"], p["b"], initial_state=state0, activation="silu")
    return y


@pytest.mark.parametrize("tokens", [1, 3])
def test_update_shifting_state_equals_forward_of_history(tokens):
    p = _problem(seed=6, width=4)
    state_len = 5
    gen = torch.Generator().manual_seed(1)
    conv_state = _rand(gen, 2, 3, state_len)
    history = conv_state.clone()
    kernel = ReferenceKernel()
    chunks = [_rand(gen, 2, 3, tokens) for _ in range(4)]
    ys = [kernel.update(c, conv_state, p["w"], p["b"], activation="silu") for c in chunks]
    expected = _history_forward(p, chunks, history[:, :, -3:])
    assert torch.allclose(torch.cat(ys, 2), expected, atol=1e-14, rtol=0)
    assert torch.equal(conv_state, torch.cat([history, *chunks], 2)[:, :, -state_len:])


def test_update_ring_buffer_wraps_and_last_token_wins():
    p = _problem(seed=7, width=3)
    state_len = 4
    gen = torch.Generator().manual_seed(2)
    ring = _rand(gen, 2, 3, state_len)
    start = torch.tensor([3, 1], dtype=torch.int32)
    # Logical history of row b: the state read oldest-first starting at column start[b].
    logical = torch.stack([torch.roll(ring[b], -int(start[b]), dims=1) for b in range(2)])
    x = _rand(gen, 2, 3, 6)  # 6 tokens > state_len 4: the ring wraps and overwrites itself
    y = ReferenceKernel().update(x, ring, p["w"], p["b"], activation="silu", cache_seqlens=start)
    expected = _history_forward(p, [x], logical[:, :, -2:])
    assert torch.allclose(y, expected, atol=1e-14, rtol=0)
    for b in range(2):
        for col in range(state_len):
            # the last of the tokens t with (start + t) % S == col is the one that stays
            t_last = max(t for t in range(6) if (int(start[b]) + t) % state_len == col)
            assert torch.equal(ring[b, :, col], x[b, :, t_last])


def test_update_slot_indices_pad_rows_untouched():
    p = _problem(seed=8, width=4)
    gen = torch.Generator().manual_seed(3)
    pool = _rand(gen, 5, 3, 3)
    before = pool.clone()
    x = _rand(gen, 3, 3, 2)
    slots = torch.tensor([4, -1, 0], dtype=torch.int32)
    y = ReferenceKernel().update(x, pool, p["w"], p["b"], state_indices=slots)
    assert torch.equal(y[1], torch.zeros(3, 2, dtype=F64))
    for untouched in (1, 2, 3):
        assert torch.equal(pool[untouched], before[untouched])
    for row, slot in ((0, 4), (2, 0)):
        expected = reference_forward(
            x[row : row + 1], p["w"], p["b"], initial_state=before[slot : slot + 1]
        )
        assert torch.allclose(y[row : row + 1], expected, atol=1e-14, rtol=0)
        assert torch.equal(pool[slot], torch.cat([before[slot], x[row]], 1)[:, -3:])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x": torch.zeros(2, 3)}, "x must be"),
        ({"weight": torch.zeros(4, 3)}, "weight must be"),
        ({"bias": torch.zeros(4)}, "bias must be"),
        ({"initial_state": torch.zeros(2, 3, 2)}, "initial_state must be"),
        ({"seq_idx": torch.zeros(2, 5)}, "seq_idx must be an integer"),
        ({"activation": "gelu"}, "activation must be"),
    ],
)
def test_contract_errors(kwargs, match):
    args = {"x": torch.zeros(2, 3, 5), "weight": torch.zeros(3, 4), "bias": None}
    args.update({k: kwargs[k] for k in ("x", "weight", "bias") if k in kwargs})
    extra = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(ContractError, match=match):
        reference_forward(args["x"], args["weight"], args["bias"], **extra)
