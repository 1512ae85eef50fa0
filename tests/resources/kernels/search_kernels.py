"""Kernels for the searches' tests (tests/test_explore.py, tests/test_shrink.py).

Import as ``--kernel search_kernels:NAME`` with this directory on ``PYTHONPATH``. Each is the
``torch`` framework path with its defect, so everything but the defect is right.
"""

from __future__ import annotations

import os
import time

import torch

from convmatrix.kernels.builtin.framework import TorchKernel

# TwoBugs: bug A (y wrong) past LONG tokens, bug B (dw wrong) at SHORT tokens or fewer.
LONG = 64
SHORT = 2


class Hangs(TorchKernel):
    """Sleeps an hour in every call: a search of it must still end with its budget."""

    name = "hangs"

    def forward(self, x, weight, bias=None, **kwargs):
        time.sleep(3600)
        return super().forward(x, weight, bias, **kwargs)

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        time.sleep(3600)
        return super().update(x, conv_state, weight, bias, **kwargs)


def _slow_call(x: torch.Tensor) -> None:
    """``SLOW_S`` seconds; the call's ``length,channels`` appended to ``$CALLS_LOG`` when set
    (a test watches it to know which case the search is running)."""
    log = os.environ.get("CALLS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{x.shape[-1]},{x.shape[1]}\n")
    time.sleep(float(os.environ.get("SLOW_S", "0.3")))


class SlowReversedTaps(TorchKernel):
    """Wrong on every case (the taps reversed) and ``SLOW_S`` seconds per call: a search finds
    failures in its first round and is still busy a few seconds later, when a test stops it."""

    name = "slow_reversed_taps"

    def forward(self, x, weight, bias=None, **kwargs):
        _slow_call(x)
        return super().forward(x, weight.flip(-1), bias, **kwargs)

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        _slow_call(x)
        return super().update(x, conv_state, weight.flip(-1), bias, **kwargs)


class _DoubledGradient(torch.autograd.Function):
    """The identity forward; its backward doubles the gradient (a wrong dw, nothing else)."""

    @staticmethod
    def forward(ctx, t):  # type: ignore[override]
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return 2 * grad


class TwoBugs(TorchKernel):
    """Two bugs on different triggers, failing different outputs: past ``LONG`` tokens the
    output y is off by a constant (A: y only, the gradients stay right); at ``SHORT`` tokens or
    fewer the weight's gradient is doubled (B: dw only). A shrink of a failure of A walks
    lengths down through B's trigger: it must not keep a candidate failing only with B."""

    name = "two_bugs"

    def forward(self, x, weight, bias=None, **kwargs):
        length = x.shape[-1]
        if length <= SHORT and weight.requires_grad:
            weight = _DoubledGradient.apply(weight)
        out = super().forward(x, weight, bias, **kwargs)
        if length <= LONG:
            return out
        if isinstance(out, tuple):
            return (out[0] + 1.0, *out[1:])
        return out + 1.0
