"""Kernels that attack the process they run in, one attack per sequence length (issue 23).

Import as ``--kernel hostile_kernels:Hostile`` with this directory on ``PYTHONPATH``; run on
``hostile.matrix.yaml`` (bfloat16, with a final state). Every other case, and everything but
the attack, is the ``torch`` framework path. ``tests/test_hostile_kernels.py`` runs them.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from convmatrix.kernels.builtin.framework import TorchKernel

ANSI = "\x1b[31mboom\x1b[0m \x1b]0;pwned\x07\rspoofed \x1b[2J"
# seqlen -> attack; 16, 17 and 18 are clean
ATTACKS = {
    3: "final_float64",  # a float64 final state for a bfloat16 case: must fail, naming F
    4: "final_meta",  # the final state on the meta device: the kernel's failure
    5: "final_numpy",  # the final state as a numpy array: the kernel's failure
    6: "str_raises",  # an exception whose __str__ raises
    7: "default_device",  # torch.set_default_device("meta") and float64 default dtype
    8: "clean",  # right after 7: must be unharmed
    9: "recursion_limit",  # sys.setrecursionlimit(60)
    10: "ansi",  # an ANSI-coloured message and warning (screen clear, window title, \r)
    11: "ignores_sigterm",  # SIGTERM ignored from now on
    12: "daemon",  # a setsid + double-fork daemon, out of the process tree
    13: "numpy_y",  # fwd_bwd: y as a numpy array
}

_DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _attack(x: torch.Tensor) -> str | None:
    return ATTACKS.get(x.shape[-1])


class Hostile(TorchKernel):
    name = "hostile"

    def forward(self, x, weight, bias=None, **kwargs):
        attack = _attack(x)
        if attack == "str_raises":
            raise StrRaises()
        if attack == "ansi":
            warnings.warn(f"kernel warning {ANSI}", UserWarning, stacklevel=2)
            raise ValueError(ANSI)
        if attack == "default_device":
            torch.set_default_device("meta")
            torch.set_default_dtype(torch.float64)
        if attack == "recursion_limit":
            sys.setrecursionlimit(60)
        if attack == "ignores_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if attack == "daemon" and os.environ.get("HOSTILE_DAEMON_PID"):
            pid_file = os.environ["HOSTILE_DAEMON_PID"]
            subprocess.run([sys.executable, "-c", _DAEMON, pid_file], check=True)
            deadline = time.monotonic() + 30
            while not Path(pid_file).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        with torch.device("cpu"):  # the attack above must not break the attack itself
            out = super().forward(x, weight, bias, **kwargs)
        if attack == "numpy_y":
            return (
                out[0].detach().float().numpy()
                if isinstance(out, tuple)
                else (out.detach().float().numpy())
            )
        if not isinstance(out, tuple):
            return out
        y, final = out
        if attack == "final_float64":
            return y, final.double()
        if attack == "final_meta":
            return y, torch.empty(final.shape, dtype=final.dtype, device="meta")
        if attack == "final_numpy":
            return y, final.detach().float().numpy()
        return y, final


class LeavesThreads(TorchKernel):
    """The torch path that leaves a non-daemon thread sleeping an hour, and an atexit hook
    doing the same, on its first call: a -n 0 run must still end with its status."""

    name = "leaves_threads"
    started = False

    def forward(self, x, weight, bias=None, **kwargs):
        if not LeavesThreads.started:
            LeavesThreads.started = True
            threading.Thread(target=time.sleep, args=(3600,), name="kernel-sleeper").start()
            atexit.register(time.sleep, 3600)
        return super().forward(x, weight, bias, **kwargs)


class LeavesAHook(TorchKernel):
    """The torch path that registers an atexit hook writing the file ``HOSTILE_HOOK_MARK``
    names, on its first call: the process that ran it ends without running it."""

    name = "leaves_a_hook"
    registered = False

    def forward(self, x, weight, bias=None, **kwargs):
        if not LeavesAHook.registered:
            LeavesAHook.registered = True
            mark = Path(os.environ["HOSTILE_HOOK_MARK"])
            atexit.register(mark.write_text, "the kernel's hook ran")
        return super().forward(x, weight, bias, **kwargs)


class HoldsTheGIL(TorchKernel):
    """On the case of seqlen 12, a regular expression that backtracks for ever: one C call
    that never releases the GIL (no Python-level watchdog can run)."""

    name = "holds_the_gil"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] == 12:
            re.match(r"(a+)+$", "a" * 64 + "b")
        return super().forward(x, weight, bias, **kwargs)


class IgnoresSigterm(TorchKernel):
    """Ignores SIGTERM on its first case, then takes two seconds per case."""

    name = "ignores_sigterm"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] == 3:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            Path(os.environ["HOSTILE_READY"]).write_text("ignoring SIGTERM")
        else:
            time.sleep(2.0)
        return super().forward(x, weight, bias, **kwargs)


class Chatty(TorchKernel):
    """Prints ``$CHATTY_MB`` MB of coloured text (Python and C level) per call; fails the
    case of seqlen 12 so that pytest shows what it captured."""

    name = "chatty"

    def forward(self, x, weight, bias=None, **kwargs):
        mb = float(os.environ.get("CHATTY_MB", "8"))
        line = "\x1b[32m" + "g" * 90 + "\x1b[0m\n"
        text = line * int(mb * (1 << 20) / len(line))
        sys.stdout.write("first line of the kernel\n" + text[: len(text) // 2])
        sys.stdout.flush()
        os.write(1, text[len(text) // 2 :].encode() + b"last line of the kernel\n")
        if x.shape[-1] == 12:
            raise ValueError("fails after printing")
        return super().forward(x, weight, bias, **kwargs)


class WritesOutsideInChecks(TorchKernel):
    """Correct on the main call; on a shorter x than it has seen (the chunks of the chunk
    consistency check) it writes into the storage just before the view: only guards around
    the property checks' own calls can see it."""

    name = "writes_outside_in_checks"

    def __init__(self) -> None:
        super().__init__()
        self.longest: dict[tuple[int, ...], int] = {}

    def forward(self, x, weight, bias=None, **kwargs):
        key = tuple(x.shape[:-1])
        if x.shape[-1] < self.longest.get(key, 0) and x.storage_offset() > 0:
            with torch.no_grad():
                x.detach().as_strided((1,), (1,), x.storage_offset() - 1).fill_(0.0)
        self.longest[key] = max(self.longest.get(key, 0), x.shape[-1])
        return super().forward(x, weight, bias, **kwargs)


__all__ = [
    "Chatty",
    "HoldsTheGIL",
    "Hostile",
    "IgnoresSigterm",
    "LeavesThreads",
    "WritesOutsideInChecks",
    "np",
]
