"""A correct kernel that takes its time: a run of it lasts long enough to lose a node during
it (tests/test_ray_executor.py). Import as ``--kernel slow_kernels:SlowTorch``."""

from __future__ import annotations

import os
import time

from convmatrix.kernels.builtin.framework import TorchKernel

DELAY_S = float(os.environ.get("CONVMATRIX_SLOW_DELAY_S", "0.15"))


class SlowTorch(TorchKernel):
    """The torch path, each forward and update ``DELAY_S`` late."""

    name = "slow_torch"

    def forward(self, x, weight, bias=None, **kwargs):
        time.sleep(DELAY_S)
        return super().forward(x, weight, bias, **kwargs)

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        time.sleep(DELAY_S)
        return super().update(x, conv_state, weight, bias, **kwargs)
