"""Checks of the oracle itself, before any kernel is compared with it (the seed's reference.py).

Each check returns a ``CheckResult`` with its measured error and the limit it is held to:
- a hand-computed K=3 example with asymmetric weights;
- SiLU at z=0 halves the upstream gradient;
- central finite differences of L = <g, y> + <q, F> on every parameter;
- whole sequence vs token-by-token; a length-5 sequence split 1+4 with the state carried,
  forward and backward, with the state gradient kept and detached;
- the vectorised reference equals the scalar one on random small cases;
- with ``device``: the reference computed on that device (values and bound magnitudes) equals
  the host's: bit for bit on the CPU; on an accelerator within ``DEVICE_LIMIT`` relative to
  each element's magnitude (float64 on both, but another order of summation and FMA
  contraction: each element of a reference is a sum of at most a few thousand products here,
  so their roundings differ by at most n u = 2^-53 x 2048 ~ 2.3e-13 of the sum of |terms|;
  1e-12 leaves a margin and is still 10^4 below the fp32 unit roundoff a kernel is judged by).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from convmatrix.kernels.oracle.reference import (
    ReferenceKernel,
    backward_magnitudes,
    conv_forward,
    forward_magnitudes,
    reference_forward,
)
from convmatrix.kernels.oracle.scalar import row_backward, row_forward

__all__ = ["CHECKS", "DEVICE_LIMIT", "CheckResult", "device_reference", "run_selfcheck"]

DEVICE_LIMIT = 1e-12  # see the module's text

F64 = torch.float64


@dataclass(frozen=True)
class CheckResult:
    name: str
    error: float  # the measured max abs difference
    limit: float

    @property
    def passed(self) -> bool:
        return self.error <= self.limit


def _maxdiff(a, b) -> float:
    a = torch.as_tensor(a, dtype=F64).detach()
    b = torch.as_tensor(b, dtype=F64).detach()
    return float((a - b).abs().max()) if a.numel() else 0.0


def hand_computed_k3() -> CheckResult:
    r"""K=3, w = [0.5, -1, 2], bias 0.25, x = [1, 2, 3, 4], initial state [1, -2], no SiLU.

    With xe = [1, -2, 1, 2, 3, 4] (state then x), z[t] = b + w0 xe[t] + w1 xe[t+1] + w2 xe[t+2]:
        y = [4.75, 2.25, 4.75, 6.25],  F = [3, 4].
    On x alone the map is y = A x + c with the banded (lower-triangular) matrix
            [ 2   0   0  0 ]
        A = [-1   2   0  0 ]      (w2 on the diagonal: the current token;
            [ .5 -1   2  0 ]       w0 two places left: the oldest tap)
            [ 0  .5  -1  2 ]
    so dx = A^T g + [0, 0, q0, q1] with A^T = [[2, -1, .5, 0], [0, 2, -1, .5], [0, 0, 2, -1],
    [0, 0, 0, 2]]. For g = [1, -1, 2, 0.5] and q = [0.5, -1]:
        A^T g = [4, -3.75, 3.5, 1]  →  dx = [4, -3.75, 4, 0].
    dS[0] = w0 g0 = 0.5, dS[1] = w0 g1 + w1 g0 = -1.5; db = sum g = 2.5;
    dw[k] = sum_t g[t] xe[t+k] = [6, 2.5, 7].
    """
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], dtype=F64, requires_grad=True)
    w = torch.tensor([[0.5, -1.0, 2.0]], dtype=F64, requires_grad=True)
    b = torch.tensor([0.25], dtype=F64, requires_grad=True)
    s = torch.tensor([[[1.0, -2.0]]], dtype=F64, requires_grad=True)
    g = torch.tensor([[[1.0, -1.0, 2.0, 0.5]]], dtype=F64)
    q = torch.tensor([[[0.5, -1.0]]], dtype=F64)
    y, final = reference_forward(x, w, b, initial_state=s, return_final_state=True)
    ((y * g).sum() + (final * q).sum()).backward()
    expected = [
        (y, [4.75, 2.25, 4.75, 6.25]),
        (final, [3.0, 4.0]),
        (x.grad, [4.0, -3.75, 4.0, 0.0]),
        (s.grad, [0.5, -1.5]),
        (b.grad, [2.5]),
        (w.grad, [6.0, 2.5, 7.0]),
    ]
    err = max(_maxdiff(t.flatten(), v) for t, v in expected)
    return CheckResult("hand-computed K=3 example (y, F, dx, dS, dw, db)", err, 1e-15)


def silu_half_at_zero() -> CheckResult:
    """With z = 0 (zero input, zero bias) silu'(0) = 1/2: every dx is half of sum_k w[k] g."""
    x = torch.zeros(1, 2, 6, dtype=F64, requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)  # dx[t] = g[t-0 or t+1] * w
    y = reference_forward(x, w, torch.zeros(2, dtype=F64), activation="silu")
    g = torch.linspace(-1, 1, 12, dtype=F64).reshape(1, 2, 6)
    (y * g).sum().backward()
    expected = torch.stack([torch.cat([g[0, 0, 1:], g.new_zeros(1)]), g[0, 1]]) * 0.5
    return CheckResult(
        "SiLU at z=0 halves the upstream gradient", _maxdiff(x.grad[0], expected), 1e-15
    )


def _problem(seed: int, batch=2, dim=3, seqlen=7, width=4):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    return dict(
        x=rnd(batch, dim, seqlen),
        w=rnd(dim, width),
        b=rnd(dim),
        s=rnd(batch, dim, width - 1),
        g=rnd(batch, dim, seqlen),
        q=rnd(batch, dim, width - 1),
    )


def finite_differences() -> CheckResult:
    """Central differences (eps=1e-6) of L = <g,y> + <q,F> vs the explicit backward.

    In float64 the truncation error is O(eps^2 |L'''|) ~ 1e-12 and the cancellation error
    O(ulp |L| / eps) ~ 1e-9, hence the 1e-7 limit.
    """
    p = _problem(1)
    params = {k: p[k].clone().requires_grad_(True) for k in ("x", "w", "b", "s")}

    def loss(v):
        y, f = reference_forward(
            v["x"], v["w"], v["b"], initial_state=v["s"], return_final_state=True, activation="silu"
        )
        return (y * p["g"]).sum() + (f * p["q"]).sum()

    loss(params).backward()
    eps, err = 1e-6, 0.0
    with torch.no_grad():
        for _name, t in params.items():
            flat = t.detach().view(-1)
            for i in range(flat.numel()):
                orig = float(flat[i])
                flat[i] = orig + eps
                up = float(loss(params))
                flat[i] = orig - eps
                down = float(loss(params))
                flat[i] = orig
                err = max(err, abs((up - down) / (2 * eps) - float(t.grad.view(-1)[i])))
    return CheckResult("finite differences on x, weight, bias, initial state (SiLU, dF)", err, 1e-7)


def token_by_token() -> CheckResult:
    """The whole sequence equals L single-token updates from the same initial state."""
    p = _problem(2, seqlen=9)
    y = reference_forward(p["x"], p["w"], p["b"], initial_state=p["s"], activation="silu")
    state = p["s"].clone()
    kernel = ReferenceKernel()
    ys = [
        kernel.update(p["x"][:, :, t : t + 1], state, p["w"], p["b"], activation="silu")
        for t in range(p["x"].shape[2])
    ]
    return CheckResult(
        "whole sequence vs token-by-token update", _maxdiff(y, torch.cat(ys, 2)), 1e-14
    )


def _split_grads(p, detach: bool):
    x = p["x"].clone().requires_grad_(True)
    w = p["w"].clone().requires_grad_(True)
    s = p["s"].clone().requires_grad_(True)
    y1, f1 = reference_forward(
        x[:, :, :1], w, p["b"], initial_state=s, return_final_state=True, activation="silu"
    )
    carried = f1.detach() if detach else f1
    y2, f2 = reference_forward(
        x[:, :, 1:], w, p["b"], initial_state=carried, return_final_state=True, activation="silu"
    )
    y = torch.cat([y1, y2], 2)
    ((y * p["g"]).sum() + (f2 * p["q"]).sum()).backward()
    return y, f2, x.grad, w.grad, s.grad


def split_one_plus_four() -> list[CheckResult]:
    """Length 5 split 1+4, state carried. Kept: all equal the whole call. Detached: y, F and
    dw still equal (the weights see the same values); dx and dS equal the whole call's
    gradients with the upstream gradient of the second chunk zeroed (nothing flows back)."""
    p = _problem(3, seqlen=5)

    def whole(g, q):
        x = p["x"].clone().requires_grad_(True)
        w = p["w"].clone().requires_grad_(True)
        s = p["s"].clone().requires_grad_(True)
        y, f = reference_forward(
            x, w, p["b"], initial_state=s, return_final_state=True, activation="silu"
        )
        ((y * g).sum() + (f * q).sum()).backward()
        return y, f, x.grad, w.grad, s.grad

    ref = whole(p["g"], p["q"])
    kept = _split_grads(p, detach=False)
    kept_err = max(_maxdiff(a, b) for a, b in zip(ref, kept, strict=True))
    det = _split_grads(p, detach=True)
    g_first = p["g"].clone()
    g_first[:, :, 1:] = 0
    first_only = whole(g_first, torch.zeros_like(p["q"]))
    det_err = max(
        _maxdiff(ref[0], det[0]),
        _maxdiff(ref[1], det[1]),
        _maxdiff(ref[3], det[3]),
        _maxdiff(first_only[2][:, :, :1], det[2][:, :, :1]),
        _maxdiff(first_only[4], det[4]),
    )
    return [
        CheckResult(
            "split 1+4, state gradient kept: y, F, dx, dw, dS equal whole", kept_err, 1e-13
        ),
        CheckResult(
            "split 1+4, state detached: y, F, dw equal; dx0, dS = chunk-1 only", det_err, 1e-13
        ),
    ]


def vectorised_vs_scalar(cases: int = 20) -> CheckResult:
    """Random small problems (K 1..5, L 1..9, with/without SiLU, state, dF) row by row."""
    rng = random.Random(4)
    err = 0.0
    for i in range(cases):
        width, seqlen = rng.randint(1, 5), rng.randint(1, 9)
        silu = bool(i % 2)
        p = _problem(100 + i, batch=2, dim=2, seqlen=seqlen, width=width)
        x = p["x"].clone().requires_grad_(True)
        w = p["w"].clone().requires_grad_(True)
        b = p["b"].clone().requires_grad_(True)
        s = p["s"].clone().requires_grad_(True)
        act = "silu" if silu else None
        y, f = reference_forward(x, w, b, initial_state=s, return_final_state=True, activation=act)
        ((y * p["g"]).sum() + (f * p["q"]).sum()).backward()
        dw = [[0.0] * width for _ in range(2)]
        db = [0.0, 0.0]
        for bi in range(2):
            for c in range(2):
                row = (
                    p["x"][bi, c].tolist(),
                    p["w"][c].tolist(),
                    float(p["b"][c]),
                    p["s"][bi, c].tolist(),
                )
                ys, fs, _ = row_forward(*row, silu)
                grads = row_backward(*row, p["g"][bi, c].tolist(), p["q"][bi, c].tolist(), silu)
                err = max(
                    err,
                    _maxdiff(y[bi, c], ys),
                    _maxdiff(f[bi, c], fs),
                    _maxdiff(x.grad[bi, c], grads.dx),
                    _maxdiff(s.grad[bi, c], grads.ds),
                )
                dw[c] = [a + d for a, d in zip(dw[c], grads.dw, strict=True)]
                db[c] += grads.db
        err = max(err, _maxdiff(w.grad, dw), _maxdiff(b.grad, db))
    return CheckResult(f"vectorised == scalar reference on {cases} random cases", err, 1e-12)


CHECKS: tuple[Callable[[], CheckResult | list[CheckResult]], ...] = (
    hand_computed_k3,
    silu_half_at_zero,
    finite_differences,
    token_by_token,
    split_one_plus_four,
    vectorised_vs_scalar,
)


def _reference_on(device: torch.device, p: dict, activation: str | None) -> list[torch.Tensor]:
    """Every value and magnitude tensor of a forward and backward on ``device``, on the host."""
    on = {k: v.to(device) for k, v in p.items()}
    y, final, saved = conv_forward(on["x"], on["w"], on["b"], on["s"], None, activation,
                                   magnitudes=True)  # fmt: skip
    (dx, dw, db, ds), mags = backward_magnitudes(saved, on["w"], on["g"], on["q"])
    found = [y, final, dx, dw, db, ds, *forward_magnitudes(saved, y).__dict__.values()]
    for m in mags.values():
        found += list(m.__dict__.values())
    return [t.cpu() for t in found if isinstance(t, torch.Tensor)]


def device_reference(device: str | torch.device, cases: int = 6) -> CheckResult:
    """The reference on ``device`` against the host's, relative to each element's size."""
    device = torch.device(device)
    err = 0.0
    for seed in range(cases):
        p = _problem(100 + seed, batch=2, dim=5, seqlen=33 + seed, width=2 + seed % 3)
        activation = "silu" if seed % 2 else None
        host = _reference_on(torch.device("cpu"), p, activation)
        there = _reference_on(device, p, activation)
        for a, b in zip(host, there, strict=True):
            err = max(err, float(((a - b).abs() / (1 + a.abs())).max()) if a.numel() else 0.0)
    limit = 0.0 if device.type == "cpu" else DEVICE_LIMIT
    return CheckResult(f"reference on {device} == on the host (values, magnitudes)", err, limit)


def run_selfcheck(device: str | None = None) -> list[CheckResult]:
    """Every check of the oracle; with ``device``, its reference there against the host's."""
    results: list[CheckResult] = []
    for check in CHECKS:
        out = check()
        results.extend(out if isinstance(out, list) else [out])
    if device is not None:
        results.append(device_reference(device))
    return results
