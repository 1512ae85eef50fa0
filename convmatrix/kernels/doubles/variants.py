"""Benign variants of the honest FP32 kernel: the same formulas with the sums taken in another
order, compensated, or in float64. Test doubles for the error-regression rule
(``compare.errors``, docs/regression-rule.md): a change between any two of them, or between
one of them and another kernel of the same declared arithmetic, is not a precision
regression, and the rule must not call it one.

Each is ``defects.Fp32Kernel``'s computation (taps from the stored inputs, SiLU, backward by
the formulas, results rounded once to their storage dtype) with its sums spelled out as lists
of terms: ``window_sum`` adds the terms of a window (the bias and K taps of z; the K taps and
dF of dx, dS), ``reduce`` the B*L terms of dw and db, ``compute`` is the dtype everything is
computed in. Each declares the default arithmetic (FP32 accumulation, FP32 intermediates),
which it keeps or betters.

- ``InOrderSums``: left to right, in ``Fp32Kernel``'s order (which multiplies and adds in one
  ``addcmul_``: their y may differ in the last bit); B*L reductions by ``torch.sum``;
- ``ReversedSums``: windows right to left (the bias last); B*L reductions by a pairwise tree
  over the tokens in reverse order;
- ``SequentialSums``: B*L reductions token by token (a running sum, whose error grows like n
  where a tree's grows like log n);
- ``KahanSums``: every sum compensated (Kahan);
- ``Float64Sums``: everything in float64, rounded once to the storage dtype;
- ``ShuffledSums``: windows and reductions in a new random order on every call, declaring
  ``deterministic=False``: the run-to-run spread of a kernel that adds with atomics.

``benchmarks/bench_regression_rule.py`` runs them beside the honest kernels and the precision
defects (``defects``) and counts what the rule calls a regression.
"""

from __future__ import annotations

import random

import torch

from convmatrix.kernels.doubles.defects import Fp32Kernel
from convmatrix.kernels.interface.protocol import Capabilities
from convmatrix.kernels.interface.semantics import packed_tap_masks

__all__ = [
    "VARIANTS",
    "Float64Sums",
    "InOrderSums",
    "KahanSums",
    "ReversedSums",
    "SequentialSums",
    "ShuffledSums",
]


def _flat(terms: torch.Tensor) -> torch.Tensor:
    """(B, C, L) terms as (C, B*L), batch-major (the order a loop over b, t visits them)."""
    return terms.transpose(0, 1).reshape(terms.shape[1], -1)


class InOrderSums(Fp32Kernel):
    """``Fp32Kernel`` with its sums as lists of terms, added left to right."""

    name = "in_order_sums"
    compute = torch.float32

    # -- the sums (overridden by the variants) --------------------------------------------------
    def window_sum(self, terms: list[torch.Tensor]) -> torch.Tensor:
        """The element-wise sum of same-shaped ``terms``."""
        out = terms[0].clone()
        for t in terms[1:]:
            out += t
        return out

    def reduce(self, terms: torch.Tensor, half=None) -> torch.Tensor:
        """sum over (batch, time) of (B, C, L) terms."""
        return terms.sum(dim=(0, 2))

    # -- the computation ----------------------------------------------------------------------
    def _forward32(self, x, weight, bias, state, seq_idx, silu):
        batch, dim, seqlen = x.shape
        width = weight.shape[1]
        c = self.compute
        w = weight.to(c)
        s = x.new_zeros(batch, dim, width - 1) if state is None else state
        xe = torch.cat([s.to(c), x.to(c)], dim=2)
        masks = None if seq_idx is None else packed_tap_masks(seq_idx, width)[:, :, None, :]
        terms = [] if bias is None else [bias.to(c)[None, :, None].expand(batch, dim, seqlen)]
        for k in range(width):
            tap = xe[:, :, k : k + seqlen]
            if masks is not None:
                tap = tap * masks[k]
            terms.append(tap * w[None, :, k, None])
        z = self.window_sum(terms)
        y = z * torch.sigmoid(z) if silu else z
        if seq_idx is not None:
            y = y * (seq_idx[:, None, :] >= 0)
        return y, xe, z, masks, None

    def _backward32(self, x, weight, bias, state, seq_idx, silu, g, q):
        _, xe, z, masks, _ = self._forward32(x, weight, bias, state, seq_idx, silu)
        width, seqlen = weight.shape[1], x.shape[2]
        c = self.compute
        w = weight.to(c)
        dz = g.to(c)
        if silu:
            sg = torch.sigmoid(z)
            dz = dz * sg * (1 + z * (1 - sg))
        if seq_idx is not None:
            dz = dz * (seq_idx[:, None, :] >= 0)
        terms = []
        dw = xe.new_empty(w.shape)
        for k in range(width):
            dzk = dz if masks is None else dz * masks[k]
            term = torch.zeros_like(xe)  # exact zeros outside the window change no sum
            term[:, :, k : k + seqlen] = dzk * w[None, :, k, None]
            terms.append(term)
            dw[:, k] = self.reduce(dzk * xe[:, :, k : k + seqlen])
        if q is not None:
            term = torch.zeros_like(xe)
            term[:, :, seqlen:] = q.to(c)
            terms.append(term)
        dxe = self.window_sum(terms)
        db = self.reduce(dz)
        return dxe[:, :, width - 1 :], dw, db, dxe[:, :, : width - 1]


class ReversedSums(InOrderSums):
    """Windows added right to left (the last tap first, the bias last); the B*L reductions by
    a pairwise tree over the tokens in reverse order."""

    name = "reversed_sums"

    def window_sum(self, terms):
        return super().window_sum(terms[::-1])

    def reduce(self, terms, half=None):
        flat = _flat(terms).flip(1)
        while flat.shape[1] > 1:
            if flat.shape[1] % 2:
                flat = torch.cat([flat, flat.new_zeros(flat.shape[0], 1)], dim=1)
            flat = flat[:, 0::2] + flat[:, 1::2]
        return flat[:, 0]


class SequentialSums(InOrderSums):
    """The B*L reductions as a running sum, token by token (a plain loop's order)."""

    name = "sequential_sums"

    def reduce(self, terms, half=None):
        flat = _flat(terms)
        acc = flat.new_zeros(flat.shape[0])
        for i in range(flat.shape[1]):
            acc += flat[:, i]
        return acc


def _kahan(parts) -> torch.Tensor:
    """Kahan's compensated sum of an iterable of same-shaped tensors."""
    total = comp = None
    for t in parts:
        if total is None:
            total, comp = t.clone(), torch.zeros_like(t)
            continue
        y = t - comp
        s = total + y
        comp = (s - total) - y
        total = s
    assert total is not None
    return total


class KahanSums(InOrderSums):
    """Every sum compensated (Kahan): windows over their terms, B*L reductions token by
    token."""

    name = "kahan_sums"

    def window_sum(self, terms):
        return _kahan(terms)

    def reduce(self, terms, half=None):
        flat = _flat(terms)
        return _kahan(flat[:, i] for i in range(flat.shape[1]))


class Float64Sums(InOrderSums):
    """Everything computed in float64 and rounded once to the storage dtype."""

    name = "float64_sums"
    compute = torch.float64


class ShuffledSums(InOrderSums):
    """Windows and B*L reductions in a new random order on every call, as a kernel whose
    threads add with atomics: the same inputs give other bits from one call to the next, so it
    declares ``deterministic=False``."""

    name = "shuffled_sums"
    capabilities = Capabilities(deterministic=False)

    def __init__(self) -> None:
        self.rng = random.Random()  # seeded by the OS: no two runs alike

    def window_sum(self, terms):
        order = list(terms)
        self.rng.shuffle(order)
        return super().window_sum(order)

    def reduce(self, terms, half=None):
        flat = _flat(terms)
        gen = torch.Generator().manual_seed(self.rng.getrandbits(63))
        return flat[:, torch.randperm(flat.shape[1], generator=gen)].sum(dim=1)


VARIANTS = {
    "InOrderSums": InOrderSums,
    "ReversedSums": ReversedSums,
    "SequentialSums": SequentialSums,
    "KahanSums": KahanSums,
    "Float64Sums": Float64Sums,
    "ShuffledSums": ShuffledSums,
}
