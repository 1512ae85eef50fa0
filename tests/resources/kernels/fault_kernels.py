"""Kernels that fault on purpose, one fault per sequence length (tests/test_faults.py).

Import as ``--kernel fault_kernels:Faults`` with this directory on ``PYTHONPATH``; run on
``faults.matrix.yaml``, whose fwd cases have one seqlen per fault. Every other case (and the
fault cases' inputs) is the ``torch`` framework path, so only the fault itself differs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from convmatrix.kernels.builtin.framework import TorchKernel

SURROGATE = b"path \xff".decode("utf-8", "surrogateescape")
HUGE = 1_000_000  # characters of the huge message
LEAK_MB = 400  # what the leaking case holds on to (the matrix allows 200)
_leak: list[bytearray] = []

# seqlen -> fault; the matrix's clean seqlens are 16 and 17
FAULTS = {
    3: "surrogate",
    4: "nul",
    5: "huge",
    6: "sys_exit",
    7: "keyboard_interrupt",
    8: "float64",
    9: "child",
    10: "generator_exit",
    11: "leak",
    12: "custom_base",
}


class CustomBase(BaseException):
    """A kernel's own BaseException subclass."""


def _fault(x: torch.Tensor) -> str | None:
    return FAULTS.get(x.shape[-1])


class Faults(TorchKernel):
    name = "faults"

    def forward(self, x, weight, bias=None, **kwargs):
        fault = _fault(x)
        if fault == "surrogate":
            raise ValueError(f"cannot open {SURROGATE}")
        if fault == "nul":
            raise ValueError("bad byte \x00 in the message")
        if fault == "huge":
            raise ValueError("h" * HUGE)
        if fault == "sys_exit":
            sys.exit(0)
        if fault == "keyboard_interrupt":
            raise KeyboardInterrupt("raised by the kernel, not by a person")
        if fault == "generator_exit":
            raise GeneratorExit("kernel generator closed")
        if fault == "custom_base":
            raise CustomBase("a kernel's own BaseException")
        if fault == "child":
            child = subprocess.Popen(["sleep", "600"])
            pid_file = os.environ.get("FAULT_CHILD_PIDS")
            if pid_file:
                with Path(pid_file).open("a") as f:
                    f.write(f"{child.pid}\n")
        if fault == "leak":
            block = bytearray(LEAK_MB << 20)
            block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
            _leak.append(block)
        out = super().forward(x, weight, bias, **kwargs)
        if fault == "float64":
            return (out[0].double(), out[1]) if isinstance(out, tuple) else out.double()
        return out


class KillsItsWorker(TorchKernel):
    """SIGKILLs its own process on every call: a worker killed from outside, every time."""

    name = "kills_its_worker"

    def forward(self, x, weight, bias=None, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)


class SlowPasses(TorchKernel):
    """The torch path, four seconds per call: a run long enough to kill its controller, even
    on a loaded machine (12 cases of several calls each on two workers: over a minute)."""

    name = "slow_passes"

    def forward(self, x, weight, bias=None, **kwargs):
        import time

        time.sleep(4.0)
        return super().forward(x, weight, bias, **kwargs)


class LongName(TorchKernel):
    """A name longer than the database's kernel column (varchar(200))."""

    name = "k" * 201


def _at_seqlen_12(x: torch.Tensor) -> bool:
    return x.shape[-1] == 12


class StopsTheDatabase(TorchKernel):
    """The torch path; on the case of seqlen 12 it runs the command ``$FAULT_STOP_DB`` (a JSON
    list: ``pg_ctl stop`` of the test's private server), so the database is gone for the end
    of the run (tests/test_faults.py)."""

    name = "stops_the_database"

    def forward(self, x, weight, bias=None, **kwargs):
        command = os.environ.get("FAULT_STOP_DB")
        if command and _at_seqlen_12(x):
            subprocess.run(json.loads(command), check=True, capture_output=True, timeout=120)
        return super().forward(x, weight, bias, **kwargs)


class FillsTheDisk(TorchKernel):
    """The torch path; on the case of seqlen 12 it fills the file system of ``$FAULT_FILL``
    (a file on the small tmpfs holding the run's SQLite database) until it is full."""

    name = "fills_the_disk"

    def forward(self, x, weight, bias=None, **kwargs):
        path = os.environ.get("FAULT_FILL")
        if path and _at_seqlen_12(x):
            block = b"\0" * (64 << 10)
            with open(path, "ab", buffering=0) as f:
                try:
                    while True:
                        f.write(block)
                except OSError:  # ENOSPC: full
                    pass
        return super().forward(x, weight, bias, **kwargs)
