"""A kernel whose correctness a file decides, for the regression service's tests
(tests/test_confirm.py): ``--kernel service_kernels:Switched`` with this directory on
``PYTHONPATH`` and ``CONVMATRIX_TEST_SWITCH`` naming the file.

The file holds ``good`` (the ``torch`` path), ``bad`` (every forward output off by one, a
regression that reproduces) or ``once`` (wrong on the next forward call only, then the file
says ``good``: a failure that does not reproduce, like a flaky device). One kernel name for all
three, so the runs of each state are comparable (same kernel, matrix, device).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from convmatrix.kernels.builtin.framework import TorchKernel


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
