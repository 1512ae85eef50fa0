"""A kernel that notes the torch threads of the process running it (tests/test_threads.py).

``--kernel thread_kernels:ThreadSpy`` with ``THREAD_SPY_FILE`` set: every forward call appends
``pid threads wait-policy`` to that file, so a test sees what each worker really had.
"""

from __future__ import annotations

import os

import torch

from convmatrix.kernels.builtin.framework import TorchKernel


class ThreadSpy(TorchKernel):
    """The torch path, noting ``torch.get_num_threads()`` and ``OMP_WAIT_POLICY`` per call."""

    name = "thread_spy"

    def forward(self, x, weight, bias=None, **kwargs):
        wait = os.environ.get("OMP_WAIT_POLICY", "-")
        with open(os.environ["THREAD_SPY_FILE"], "a") as out:
            out.write(f"{os.getpid()} {torch.get_num_threads()} {wait}\n")
        return super().forward(x, weight, bias, **kwargs)
