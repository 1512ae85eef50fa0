"""A kernel whose correctness a file decides, for the regression service's tests
(tests/test_confirm.py): ``--kernel service_kernels:Switched`` with this directory on
``PYTHONPATH`` and ``CONVMATRIX_TEST_SWITCH`` naming the file.

The file holds ``good`` (the ``torch`` path), ``bad`` (every forward output off by one, a
regression that reproduces) or ``once`` (wrong on the next forward call only, then the file
says ``good``: a failure that does not reproduce, like a flaky device). One kernel name for all
three, so the runs of each state are comparable (same kernel, matrix, device). ``Loaded``
(below) is a right kernel on a host a file makes busy, for the timeout tests; ``StaleRead``
an out-of-bounds read whose garbage the file decides, for the flaky error regression.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.doubles.variants import Float64Sums


def _state() -> str:
    path = Path(os.environ["CONVMATRIX_TEST_SWITCH"])
    state = path.read_text().strip()
    if state == "once":
        path.write_text("good")
    return state


class Switched(TorchKernel):
    name = "switched"

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        if _state() != "good":
            y = out[0] if isinstance(out, tuple) else out
            with torch.no_grad():
                y += 1.0
        return out


class Loaded(TorchKernel):
    """The ``torch`` path on a host whose load a file decides (``CONVMATRIX_TEST_SWITCH``):
    ``idle`` (no delay), ``busy`` (the next forward call waits ``CONVMATRIX_TEST_DELAY_S``,
    5 s by default, then the file says ``idle``: a neighbour's job that ends) or ``hang`` (every
    call waits 10 times as long: the kernel hangs). Its outputs are always right. A sleep,
    not ``kernels.doubles.slowed``'s spin: a busy host delays the wall clock a case's limit
    is measured on, whatever the kernel's own time."""

    name = "loaded"

    def forward(self, x, weight, bias=None, **kwargs):
        delay = float(os.environ.get("CONVMATRIX_TEST_DELAY_S", "5"))
        state = _state()
        if state == "busy":
            Path(os.environ["CONVMATRIX_TEST_SWITCH"]).write_text("idle")
            time.sleep(delay)
        elif state == "hang":
            time.sleep(10 * delay)
        return super().forward(x, weight, bias, **kwargs)


class StaleRead(Float64Sums):
    """An out-of-bounds read: the first token's window picks up garbage from before the
    buffer, a little of it (``GARBAGE`` roundoffs of the window's magnitude) when the file
    says ``bad``, or on the next call only when it says ``once``, none when ``good``. What
    such a read returns changes from one run to the next; the file makes that deterministic.
    Honest otherwise (every sum in float64, rounded once)."""

    name = "stale_read"
    GARBAGE = 16.0

    def window_sum(self, terms):
        out = super().window_sum(terms)
        if _state() != "good":
            mag = sum(t.abs() for t in terms)
            out[:, 0, 0] += self.GARBAGE * 2.0**-24 * mag[:, 0, 0]
        return out
