"""The tiled kernel's decode update, and how its geometry is configured (specs, env, planner)."""

from __future__ import annotations

import pytest
import torch
from test_tiled import SMALL, assert_matches, make_problem

from convmatrix.core.errors import UsageError
from convmatrix.kernels import load
from convmatrix.kernels.builtin.tiled import ENV_VAR, TiledKernel, make, parse_geometry
from convmatrix.kernels.builtin.tiled.geometry import geometry_from_env
from convmatrix.kernels.oracle.reference import ReferenceKernel, reference_forward

# (tokens, state_len, ring, slots): one token, several, a state longer than K-1, ring writes
# that wrap (start near S, and more tokens than S), continuous batching with a pad slot.
MODES = [
    (1, 3, False, None),
    (5, 3, False, None),
    (2, 7, False, None),
    (3, 6, True, None),
    (9, 6, True, None),
    (2, 5, False, "permuted_pad"),
    (4, 5, True, "permuted_pad"),
]


@pytest.mark.parametrize(("tokens", "state_len", "ring", "slots"), MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_update_matches_reference_and_touches_only_named_rows(
    tokens, state_len, ring, slots, dtype
):
    batch, dim, width = 3, 9, 4
    p = make_problem(batch, dim, tokens, width, seed=tokens + state_len, x_dtype=dtype)
    gen = torch.Generator().manual_seed(7)
    pool_rows = batch + 2 if slots else batch
    pool = torch.randn(pool_rows, dim, state_len, generator=gen).to(p["x"].dtype)
    indices = torch.tensor([3, -1, 0], dtype=torch.int32) if slots else None
    # Ring positions: one just before the wrap, one at 0, one far past S.
    seqlens = torch.tensor([state_len - 1, 0, 3 * state_len + 2], dtype=torch.int32)
    seqlens = seqlens if ring else None
    pools = {"tiled": pool.clone(), "reference": pool.clone()}
    ys = {
        name: kernel.update(
            p["x"],
            pools[name],
            p["w"],
            p["b"],
            activation="silu",
            cache_seqlens=seqlens,
            state_indices=indices,
        )
        for name, kernel in (("tiled", TiledKernel(**SMALL)), ("reference", ReferenceKernel()))
    }
    assert_matches({"y": ys["tiled"]}, {"y": ys["reference"].double()}, {"y": dtype})
    assert torch.equal(pools["tiled"], pools["reference"])  # states are copies of inputs
    if slots:
        assert torch.equal(ys["tiled"][1], torch.zeros_like(ys["tiled"][1]))  # pad slot
        untouched = [r for r in range(pool_rows) if r not in (3, 0)]
        assert torch.equal(pools["tiled"][untouched], pool[untouched])


def test_token_by_token_updates_equal_the_full_forward():
    p = make_problem(2, 9, 37, 4, seed=1)
    kernel = TiledKernel(**SMALL)
    state = p["s"].clone()
    ys = [
        kernel.update(p["x"][:, :, t : t + 1], state, p["w"], p["b"], activation="silu")
        for t in range(37)
    ]
    whole = reference_forward(
        p["x"].double(),
        p["w"].double(),
        p["b"].double(),
        initial_state=p["s"].double(),
        activation="silu",
    )
    assert_matches({"y": torch.cat(ys, 2)}, {"y": whole}, {"y": "float32"})


def test_geometry_spec_forms():
    assert parse_geometry("T=128, C_t=16, vec=8, P=2").time_tile == 128
    assert parse_geometry("time_tile=8,channel_tile=4,vector_width=4").channel_tile == 4
    kernel = load("convmatrix.kernels.builtin.tiled:make(T=128,P=2)")
    assert kernel.capabilities.geometry.symbols() == {"tile": 128, "ctile": 32, "vec": 8, "P": 2}
    assert kernel.name == "tiled(T=128,C_t=32,vec=8,P=2)"
    assert TiledKernel(C_t=16, vec=16).geometry.vector_width == 16


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("T=0", "positive integer"),
        ("C_t=12,vec=8", "not a multiple of the vector width"),
        ("Q=3", "unknown tiled geometry key"),
        ("T=x", "not an integer"),
        ("T", "expected key=value"),
    ],
)
def test_bad_geometry_is_a_usage_error(text, message):
    with pytest.raises(UsageError, match=message):
        parse_geometry(text)


def test_geometry_from_environment():
    assert geometry_from_env({ENV_VAR: "T=32,P=1"}).time_tile == 32
    assert geometry_from_env({}).time_tile == 64
    with pytest.raises(UsageError, match=ENV_VAR):
        geometry_from_env({ENV_VAR: "T=-1"})


def test_planner_budget_picks_the_geometry():
    # 31488 bytes is exactly the SiLU backward of T=64, C_t=32 at K=4, bf16/fp32 (see
    # test_planner.py for the hand count); with vec=32 the only channel tile is 32.
    kernel = make(budget=31488, width=4, dtype="bfloat16/float32", dim=32, vec=32)
    assert (kernel.geometry.time_tile, kernel.geometry.channel_tile) == (64, 32)
    with pytest.raises(UsageError, match="need budget"):
        make(dim=32)
