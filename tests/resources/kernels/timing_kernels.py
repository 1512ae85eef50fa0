"""Kernels for the timing tests (tests/test_perf_*.py): time that noise cannot move.

Import them as ``--kernel timing_kernels:NAME`` with this directory on ``PYTHONPATH``.
``Busy`` is the ``torch`` framework path plus a fixed amount of the timing clock per call,
proportional to its work (``convmatrix.kernels.doubles.slowed.spend``: spun on the process CPU
clock, so the machine's other load does not change it): its timings are the same in every run up to
the framework path's own small share, which is what makes A/A and 1.5x decisions testable
without asserting any wall-clock time. Its backward spends the same again.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.doubles.slowed import spend
from convmatrix.kernels.interface.corecall import CoreArgs, CoreCall
from convmatrix.kernels.interface.protocol import Capabilities, Geometry

SECONDS_PER_ELEMENT = 4e-6  # 4 ms per 1000 outputs: far above the torch path's own cost here


def _cost(x: torch.Tensor) -> float:
    return SECONDS_PER_ELEMENT * x.numel()


class _SpendBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, seconds, t):  # type: ignore[override]
        ctx.seconds = seconds
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        spend(ctx.seconds)
        return None, grad


class Busy(TorchKernel):
    """The torch path, spending ``SECONDS_PER_ELEMENT`` per output element per pass."""

    name = "busy"
    # A declared time tile, so the report draws backward time against time tiles.
    capabilities = Capabilities(
        geometry=Geometry(time_tile=16, channel_tile=8, vector_width=4), intermediate="input"
    )

    def forward(self, x, weight, bias=None, **kwargs):  # type: ignore[override]
        spend(_cost(x))
        out = super().forward(x, weight, bias, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        if y.requires_grad:
            y = _SpendBackward.apply(_cost(x), y)
        return (y, out[1]) if isinstance(out, tuple) else y

    def update(self, x, conv_state, weight, bias=None, **kwargs):  # type: ignore[override]
        spend(_cost(x))
        return super().update(x, conv_state, weight, bias, **kwargs)

    def core_call(self, args: CoreArgs) -> CoreCall | None:  # type: ignore[override]
        inner = super().core_call(args)
        if inner is None:
            return None
        passes = 2 if args.op == "fwd_bwd" else 1

        def call() -> object:
            spend(passes * _cost(args.x))
            return inner()

        return call
