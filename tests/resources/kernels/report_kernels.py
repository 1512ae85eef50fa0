"""A kernel with a seeded tile-boundary bug, for the report end-to-end tests
(tests/test_report_e2e.py). Import as ``--kernel report_kernels:TailBug`` with this directory
on ``PYTHONPATH``.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.protocol import Capabilities, Geometry

TILE = 8


class TailBug(TorchKernel):
    """The ``torch`` path, except that a sequence one token past a tile boundary (L = n*T+1)
    in the channel-last layout gets its last output scaled by 1.5: a tail-block bug that only
    the (tile+1, channel_last) corner of the matrix reaches."""

    name = "tail_bug"
    capabilities = Capabilities(geometry=Geometry(time_tile=TILE), intermediate="input")

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        channel_last = x.dim() == 3 and x.stride(1) == 1 and x.shape[1] > 1
        if channel_last and x.shape[-1] % TILE == 1 and x.shape[-1] > TILE:
            y = out[0] if isinstance(out, tuple) else out
            with torch.no_grad():
                y[..., -1] *= 1.5
        return out
