"""The tiled kernel against the float64 reference at tile boundaries, in every layout and dtype.

Every output is judged like the matrix's threshold policy judges it: errors against the
float64 reference computed from the same dtype-rounded inputs, e_rel with tau = rms(reference)
and e_norm, under a (dtype, output) limit. The limits are written here (``LIMITS``), not read
from the product's table (``convmatrix.core.tolerances``, pinned to the same values by
tests/test_tolerances.py), so loosening that table cannot loosen these tests. The row is chosen
by the dtype the output is stored in (dw/db: the weight dtype; the rest: x's), because that
final rounding is the largest error the kernel is allowed. For fp32 that is 32 x 2^-24 ~ 1.9e-6
relative (dw/db 4x), while an indexing bug at a tile boundary gives O(1) errors.
"""

from __future__ import annotations

import pytest
import torch

from convmatrix.kernels import ContractError, load
from convmatrix.kernels.builtin.tiled import TiledKernel
from convmatrix.kernels.oracle.reference import reference_forward

OUTPUTS = ("y", "F", "dx", "dw", "db", "dS")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SMALL = {"T": 16, "C_t": 8, "vec": 4, "P": 2}  # tiles small enough to cross cheaply

# (e_rel, e_norm) limits by storage dtype. Unit roundoff u (half an ulp, relative): 2^-24 fp32,
# 2^-11 fp16, 2^-8 bf16. The final rounding to the dtype alone is up to u relative; the K fp32
# products before it (K = 2..6 here) add a few 2^-24 of the data scale: e_rel <= 32 u leaves
# room for both; e_norm <= 8 u, as rounding errors average out over many elements. An O(1)
# indexing error is far above both. dw and db are reductions over B*L terms summed in another
# order than the float64 reference's: 4x both (still orders of magnitude below an indexing bug).
LIMITS = {
    "float32": (32 * 2.0**-24, 8 * 2.0**-24),  # 1.9e-6, 4.8e-7
    "float16": (32 * 2.0**-11, 8 * 2.0**-11),  # 0.0156, 0.0039
    "bfloat16": (32 * 2.0**-8, 8 * 2.0**-8),  # 0.125, 0.031
}
PARAM_GRAD_FACTOR = 4  # dw, db


def limits(dtype: str, output: str) -> tuple[float, float]:
    """(e_rel, e_norm) limits of ``output`` stored in ``dtype``."""
    rel, norm = LIMITS[dtype]
    factor = PARAM_GRAD_FACTOR if output in ("dw", "db") else 1
    return rel * factor, norm * factor


def relative_errors(a: torch.Tensor, r: torch.Tensor) -> tuple[float, float]:
    """(e_rel, e_norm) of docs/spec.md §4 with tau = rms(r) (floored so all-zero r is defined)."""
    a, r = a.detach().double(), r.detach().double()
    if r.numel() == 0:
        return 0.0, 0.0
    tau = max(float(r.pow(2).mean().sqrt()), 1e-30)
    diff = (a - r).abs()
    e_rel = float((diff / r.abs().clamp(min=tau)).max())
    e_norm = float(diff.norm() / max(float(r.norm()), tau))
    return e_rel, e_norm


def assert_matches(outputs: dict, reference: dict, dtypes: dict[str, str]) -> None:
    """Every output within the tolerance row of the dtype it is stored in."""
    failures = []
    for name, ref in reference.items():
        got = outputs[name]
        assert got is not None, f"{name} missing"
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        rel, norm = limits(dtypes[name], name)
        e_rel, e_norm = relative_errors(got, ref)
        if not (e_rel <= rel and e_norm <= norm):
            failures.append(
                f"{name}: e_rel {e_rel:.3g} (<= {rel:.3g}), e_norm {e_norm:.3g} (<= {norm:.3g})"
            )
    assert not failures, "; ".join(failures)


def make_problem(batch, dim, seqlen, width, *, seed=0, x_dtype="float32", w_dtype="float32"):
    """Random inputs rounded to their dtypes (the reference sees the same rounded values)."""
    gen = torch.Generator().manual_seed(seed)
    xd, wd = DTYPES[x_dtype], DTYPES[w_dtype]

    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=gen).to(dtype)

    return {
        "x": rnd(batch, dim, seqlen, dtype=xd),
        "w": rnd(dim, width, dtype=wd),
        "b": rnd(dim, dtype=wd),
        "s": rnd(batch, dim, width - 1, dtype=xd),
        "g": rnd(batch, dim, seqlen, dtype=xd),
        "q": rnd(batch, dim, width - 1, dtype=xd),
    }


def channel_last(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def run_both(kernel, p, *, layout="channel_first", seq_idx=None, activation="silu", state=True):
    """(kernel outputs, float64 reference outputs) for L = <g, y> + <q, F>."""

    def run(fn, cast):
        x = p["x"] if cast is None else p["x"].to(cast)
        if layout == "channel_last":
            x = channel_last(x)
        leaves = {k: (p[k] if cast is None else p[k].to(cast)) for k in ("w", "b", "s")}
        leaves["x"] = x
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in leaves.items()}
        y, final = fn(
            leaves["x"],
            leaves["w"],
            leaves["b"],
            initial_state=leaves["s"] if state else None,
            seq_idx=seq_idx,
            return_final_state=True,
            activation=activation,
        )
        g, q = p["g"].to(y.dtype), p["q"].to(final.dtype)
        ((y * g).sum() + (final * q).sum()).backward()
        out = {"y": y, "F": final, "dx": leaves["x"].grad, "dw": leaves["w"].grad}
        out["db"] = leaves["b"].grad
        if state:
            out["dS"] = leaves["s"].grad
        return out

    return run(kernel.forward, None), run(reference_forward, torch.float64)


def _stored_dtypes(x_dtype: str, w_dtype: str) -> dict[str, str]:
    return {name: (w_dtype if name in ("dw", "db") else x_dtype) for name in OUTPUTS}


# Tile-boundary lengths of docs/spec.md §3 for T=16 and channel counts around C_t=8 and vec=4.
LENGTHS = {
    "1": lambda k, t: 1,
    "K-1": lambda k, t: max(1, k - 1),
    "K": lambda k, t: k,
    "T-1": lambda k, t: t - 1,
    "T": lambda k, t: t,
    "T+1": lambda k, t: t + 1,
    "2T+1": lambda k, t: 2 * t + 1,
}
CHANNELS = (3, 5, 8, 9, 19)


@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("symbol", LENGTHS)
def test_fp32_tile_boundaries_forward_backward(layout, width, symbol):
    seqlen = LENGTHS[symbol](width, SMALL["T"])
    dim = CHANNELS[(list(LENGTHS).index(symbol) + width) % len(CHANNELS)]
    p = make_problem(2, dim, seqlen, width, seed=seqlen * 10 + width)
    got, ref = run_both(TiledKernel(**SMALL), p, layout=layout)
    assert_matches(got, ref, _stored_dtypes("float32", "float32"))
    if layout == "channel_last":  # the output keeps the input's layout
        assert got["y"].stride(1) == 1 and got["dx"].stride(1) == 1


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("state", [False, True])
def test_fp32_without_bias_state_or_activation(activation, state):
    p = make_problem(3, 9, 33, 4, seed=5)
    kernel = TiledKernel(**SMALL)
    got, ref = run_both(kernel, p, activation=activation, state=state)
    assert_matches(got, ref, _stored_dtypes("float32", "float32"))
    y = kernel.forward(p["x"], p["w"], None, activation=activation)
    y_ref = reference_forward(p["x"].double(), p["w"].double(), None, activation=activation)
    assert_matches({"y": y}, {"y": y_ref}, {"y": "float32"})


def _seq_idx(batch: int, lens: tuple[int, ...]) -> torch.Tensor:
    """Segment lengths → seq_idx; a negative length -n is n padding tokens (id -1)."""
    ids, next_id = [], 0
    for n in lens:
        if n < 0:
            ids += [-1] * -n
        else:
            ids += [next_id] * n
            next_id += 1
    return torch.tensor([ids] * batch, dtype=torch.int32)


# Boundaries inside a tile, one before/at/after a tile edge (T=16), padding in the middle,
# at the end and at the start, a sequence shorter than K-1.
PACKINGS = [(5, 28), (15, 18), (16, 17), (17, 16), (7, -3, 23), (2, 1, 27, -3), (-4, 29)]


@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("lens", PACKINGS, ids=lambda v: ".".join(map(str, v)))
def test_fp32_packed_sequences_and_padding(layout, lens):
    p = make_problem(2, 9, 33, 4, seed=len(lens))
    seq_idx = _seq_idx(2, lens)
    got, ref = run_both(TiledKernel(**SMALL), p, layout=layout, seq_idx=seq_idx)
    assert_matches(got, ref, _stored_dtypes("float32", "float32"))
    pad = seq_idx[0] < 0
    assert torch.all(got["y"][:, :, pad] == 0)
    pad[-3:] = False  # the last K-1 positions are also F, whose gradient q lands there
    assert torch.all(got["dx"][:, :, pad] == 0)


@pytest.mark.parametrize(
    "geometry",
    [
        {"T": 1, "C_t": 4, "vec": 4, "P": 1},
        {"T": 3, "C_t": 8, "vec": 8, "P": 3},
        {"T": 64, "C_t": 32, "vec": 8, "P": 4},
        {"T": 128, "C_t": 16, "vec": 8, "P": 7},
    ],
    ids=lambda g: "T{T}-Ct{C_t}-P{P}".format(**g),
)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_geometry_changes_keep_it_exact(geometry, offset):
    """Lengths and channels at this geometry's own boundaries (tile+offset, ctile+offset)."""
    seqlen = max(1, geometry["T"] + offset) if geometry["T"] > 3 else 2 * geometry["T"] + 5
    dim = geometry["C_t"] + offset
    p = make_problem(3, dim, seqlen, 4, seed=geometry["T"] + offset)
    half = seqlen // 2
    seq_idx = _seq_idx(3, (half, -1, seqlen - half - 1))  # a boundary and a padding token
    got, ref = run_both(TiledKernel(**geometry), p, seq_idx=seq_idx)
    assert_matches(got, ref, _stored_dtypes("float32", "float32"))


@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"),
    [
        ("float16", "float16"),
        ("bfloat16", "bfloat16"),
        ("bfloat16", "float32"),
        ("float16", "float32"),
        ("float32", "bfloat16"),
    ],
)
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
def test_low_precision_within_dtype_tolerances(x_dtype, w_dtype, layout):
    p = make_problem(2, 19, 33, 4, seed=11, x_dtype=x_dtype, w_dtype=w_dtype)
    seq_idx = _seq_idx(2, (15, -2, 16))
    got, ref = run_both(TiledKernel(**SMALL), p, layout=layout, seq_idx=seq_idx)
    for name, dtype in (("y", x_dtype), ("dx", x_dtype), ("dw", w_dtype), ("dS", x_dtype)):
        assert got[name].dtype == DTYPES[dtype], name
    assert_matches(got, ref, _stored_dtypes(x_dtype, w_dtype))


def test_general_strides_read_only_the_view():
    """A view with gaps on every axis inside a NaN-filled buffer: no NaN may leak in."""
    buf = torch.full((4, 30, 50), float("nan"))
    x = buf[::2, 1:20:2, 3:40]  # batch, channel and time all strided
    p = make_problem(2, 10, 37, 3, seed=3)
    x.copy_(p["x"])
    before = buf.clone()
    kernel = TiledKernel(**SMALL)
    leaf = x.detach().requires_grad_(True)  # keeps the strides of the view
    y, final = kernel.forward(leaf, p["w"], p["b"], return_final_state=True, activation="silu")
    (y * p["g"]).sum().backward()
    ref = reference_forward(p["x"].double(), p["w"].double(), p["b"].double(), activation="silu")
    assert_matches({"y": y}, {"y": ref}, {"y": "float32"})
    assert torch.isfinite(leaf.grad).all() and torch.isfinite(final).all()
    assert torch.equal(buf.isnan(), before.isnan())  # the input buffer is untouched


def test_bad_arguments_raise_contract_errors():
    kernel = TiledKernel()
    x, w = torch.randn(2, 4, 8), torch.randn(4, 3)
    with pytest.raises(ContractError):
        kernel.forward(x, torch.randn(5, 3))
    with pytest.raises(ContractError):
        kernel.forward(x, w, initial_state=torch.randn(2, 4, 3))
    with pytest.raises(ContractError):
        kernel.forward(x, w, activation="relu")


def test_registered_kernels_load_with_their_geometry():
    tiled = load("tiled")
    assert tiled.capabilities.geometry.symbols() == {"tile": 64, "ctile": 32, "vec": 8, "P": 4}
    small = load("tiled-small")
    assert small.capabilities.geometry.time_tile == 16
    assert tiled.availability() is None
