"""The tile planner's numbers against hand counts of the seed's formulas (docs/spec.md §5).

Running example: K=4, x bfloat16 (s_x=2), w float32 (s_w=4), T=64, C_t=32.
Integers throughout, so every comparison is exact.
"""

from __future__ import annotations

import pytest

from convmatrix.cli import main
from convmatrix.core.errors import UsageError
from convmatrix.kernels.builtin.planner import (
    backward_buffers,
    forward_buffers,
    geometry_for_budget,
    rank_tiles,
    workspace_bytes,
)


def _bytes(buffers):
    return {b.name: b.bytes for b in buffers}


def test_forward_single_buffer_by_hand():
    # input  (T+K-1)*C_t*s_x = 67*32*2 = 4288
    # acc    T*C_t*4         = 64*32*4 = 8192
    # weight K*C_t*s_w       =  4*32*4 =  512
    # bias   C_t*s_w         =    32*4 =  128
    # out    T*C_t*s_x       = 64*32*2 = 4096      total 17216
    buffers = forward_buffers(64, 32, 4, 2, 4, double_buffer=False)
    assert _bytes(buffers) == {
        "input": 4288,
        "acc": 8192,
        "weight": 512,
        "bias": 128,
        "out": 4096,
    }
    assert sum(b.bytes for b in buffers) == 17216


def test_forward_double_buffer_adds_item_by_item():
    # Only the streamed buffers double: input 2*4288 = 8576, out 2*4096 = 8192; acc, weight
    # and bias stay: 8576 + 8192 + 512 + 128 + 8192 = 25600 (not 2 * 17216 = 34432).
    buffers = forward_buffers(64, 32, 4, 2, 4, double_buffer=True)
    assert _bytes(buffers)["input"] == 8576 and _bytes(buffers)["out"] == 8192
    assert sum(b.bytes for b in buffers) == 25600
    assert buffers[0].formula == "2*(T+K-1)*C_t*s_x"


def test_backward_with_silu_by_hand():
    # input    (T+2K-2)*C_t*s_x = 70*32*2 = 4480
    # dy       (T+K-1)*C_t*s_x  = 67*32*2 = 4288
    # dz       (T+K-1)*C_t*4    = 67*32*4 = 8576
    # dx_acc   (T+K-1)*C_t*4    =           8576
    # partials (K+1)*C_t*4      =  5*32*4 =  640
    # weight 512, bias 128, dx_out (T+K-1)*C_t*s_x = 4288      total 31488
    buffers = backward_buffers(64, 32, 4, 2, 4, double_buffer=False)
    assert _bytes(buffers) == {
        "input": 4480,
        "dy": 4288,
        "dz": 8576,
        "dx_acc": 8576,
        "partials": 640,
        "weight": 512,
        "bias": 128,
        "dx_out": 4288,
    }
    assert sum(b.bytes for b in buffers) == 31488
    # Without SiLU z is not recomputed on the right halo: input (T+K-1)*C_t*s_x = 4288.
    assert _bytes(backward_buffers(64, 32, 4, 2, 4, False, silu=False))["input"] == 4288


def test_workspace_by_hand():
    # 4*P*C*(K+1) = 4*4*4096*5 = 327680 bytes; P=1, C=40, K=2: 4*1*40*3 = 480.
    assert workspace_bytes(4, 4096, 4) == 327680
    assert workspace_bytes(1, 40, 2) == 480


def test_ranking_at_an_exact_budget():
    # vec=32 with C=32 leaves C_t=32 only. At 17216 bytes T=64 fits exactly (above) and
    # T=128 does not (131*64 + 128*32*4 + 512 + 128 + 128*64 = 33600), so the feasible
    # tiles are T = 64, 32, 16, 8, best (smallest halo (K-1)/T) first.
    costs = rank_tiles("forward", 17216, 4, "bfloat16", "float32", 32, vec=32)
    assert [c.time_tile for c in costs] == [64, 32, 16, 8]
    best = costs[0]
    assert best.halo_ratio == 3 / 64
    # Bytes moved per output: loads (T+K-1)*C_t*s_x = 4288 and (K+1)*C_t*s_w = 640
    # (weights and bias), store T*C_t*s_x = 4096; (4288 + 640 + 4096) / (64*32) = 4.40625.
    assert best.bytes_per_output == 4.40625
    assert [
        c.time_tile for c in rank_tiles("forward", 17215, 4, "bfloat16", "float32", 32, vec=32)
    ] == [32, 16, 8]


def test_lane_use_breaks_ties_between_channel_tiles():
    # C=40, vec=8: C_t=8 covers 40 channels in 5 full tiles (100%), C_t=16 in 3 tiles
    # (40/48), C_t=32 in 2 tiles and C_t=64 in one (both 40/64; then fewer, larger tiles
    # first). Same T, same halo and bytes per output, so lane use orders them.
    costs = rank_tiles("forward", 10**9, 4, "float32", "float32", 40, vec=8)
    same_t = [c for c in costs if c.time_tile == costs[0].time_tile]
    assert [c.channel_tile for c in same_t] == [8, 16, 64, 32]
    assert same_t[1].lane_use == 40 / 48


def test_geometry_for_budget_fits_both_passes():
    geometry = geometry_for_budget(31488, width=4, dtype="bfloat16/float32", dim=32, vec=32)
    assert (geometry.time_tile, geometry.channel_tile) == (64, 32)
    with pytest.raises(UsageError, match="no tile"):
        geometry_for_budget(100, width=4, dtype="float32", dim=32)


@pytest.mark.parametrize("spelling", ["BF16", "bf16", "bfloat16", "torch.bfloat16"])
def test_plan_takes_every_dtype_spelling_the_other_commands_take(spelling, capsys):
    argv = ["plan", "--budget", "31488", "--width", "4", "--dim", "4096"]
    assert main([*argv, "--dtype", f"{spelling}/f32"]) == 0
    assert "x bfloat16 (s_x=2), w float32 (s_w=4)" in capsys.readouterr().out


def test_plan_refuses_an_unknown_dtype_naming_the_argument(capsys):
    argv = ["plan", "--budget", "31488", "--width", "4", "--dim", "64"]
    assert main([*argv, "--dtype", "int8"]) == 2
    assert "--dtype 'int8': not a case dtype" in capsys.readouterr().err


def test_plan_command_spells_out_every_buffer(capsys):
    argv = ["plan", "--budget", "31488", "--width", "4", "--dtype", "bfloat16/float32"]
    assert main([*argv, "--dim", "4096", "--vec", "32"]) == 0
    out = capsys.readouterr().out
    assert "4*P*C*(K+1) = 4*4*4096*5 = 327680" in out
    assert "input = (T+2K-2)*C_t*s_x" in out and "partials = (K+1)*C_t*4" in out
    backward = out[out.index("backward") :]
    best = backward.splitlines()[2].split()  # first row under the header
    assert best[:3] == ["1", "64", "32"] and best[-1] == "31488"
    assert main(["plan", "--budget", "0", "--width", "4", "--dtype", "fp32", "--dim", "8"]) == 2
    assert "--budget must be a positive integer" in capsys.readouterr().err
