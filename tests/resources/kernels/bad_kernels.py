"""Kernels that are wrong on purpose: the harness must catch each one (tests/test_plugin*.py).

Import them as ``--kernel bad_kernels:NAME`` with this directory on ``PYTHONPATH``. Each is the
``torch`` framework path with one defect, so everything but the defect is right.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.protocol import FEATURES, Capabilities, ContractError

# The sequence length that triggers the one-case defects (abort, hang).
TRIGGER_SEQLEN = 7


class ReversedTaps(TorchKernel):
    """Applies the weight taps in reverse order (weight[c, 0] on the current token)."""

    name = "reversed_taps"

    def forward(self, x, weight, bias=None, **kwargs):
        return super().forward(x, weight.flip(-1), bias, **kwargs)

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        return super().update(x, conv_state, weight.flip(-1), bias, **kwargs)


def _poke_past_end(t: torch.Tensor) -> None:
    """Write 0 into the element just past the last one ``t`` covers (an off-by-one store)."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    with torch.no_grad():
        torch.as_strided(t, (1,), (1,), last + 1).zero_()


class WritesPastOutput(TorchKernel):
    """Correct results, plus one store one element past the end of the buffer it writes:
    the in-place conv_state of an update, the input x of a forward (its only strided buffer)."""

    name = "writes_past_output"

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        _poke_past_end(x)
        return out

    def update(self, x, conv_state, weight, bias=None, **kwargs):
        y = super().update(x, conv_state, weight, bias, **kwargs)
        _poke_past_end(conv_state)
        return y


class AbortsOnOneCase(TorchKernel):
    """Kills its process with SIGABRT on the case whose seqlen is TRIGGER_SEQLEN."""

    name = "aborts"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] == TRIGGER_SEQLEN:
            os.abort()
        return super().forward(x, weight, bias, **kwargs)


class HangsOnOneCase(TorchKernel):
    """Sleeps for an hour on the case whose seqlen is TRIGGER_SEQLEN."""

    name = "hangs"

    def forward(self, x, weight, bias=None, **kwargs):
        if x.shape[-1] == TRIGGER_SEQLEN:
            time.sleep(3600)
        return super().forward(x, weight, bias, **kwargs)


class RaisesAlways(TorchKernel):
    name = "raises"

    def forward(self, x, weight, bias=None, **kwargs):
        raise RuntimeError("kernel launch failed: invalid configuration")


class Width4Only(TorchKernel):
    """Declares width 4 only and rejects other widths cleanly (expected-error cases pass)."""

    name = "width4"
    capabilities = Capabilities(widths=frozenset({4}), intermediate="input")

    def forward(self, x, weight, bias=None, **kwargs):
        if weight.shape[-1] != 4:
            raise ContractError(f"width {weight.shape[-1]} not supported")
        return super().forward(x, weight, bias, **kwargs)


class NonCausal(TorchKernel):
    """Reads one token ahead: y[t] is computed from x shifted left by one (a halo bug)."""

    name = "non_causal"

    def forward(self, x, weight, bias=None, **kwargs):
        ahead = torch.cat([x[..., 1:], x[..., -1:]], dim=-1)
        return super().forward(ahead, weight, bias, **kwargs)


class LooksAheadInSample(TorchKernel):
    """Reads one token ahead inside a packed sample only (the sample's last token reads
    itself): a look-ahead that seq_idx masking hides at every sample boundary."""

    name = "ahead_in_sample"

    def forward(self, x, weight, bias=None, **kwargs):
        ahead = torch.cat([x[..., 1:], x[..., -1:]], dim=-1)
        seq = kwargs.get("seq_idx")
        if seq is not None:
            last = torch.ones_like(seq, dtype=torch.bool)
            last[:, :-1] = seq[:, 1:] != seq[:, :-1]
            ahead = torch.where(last[:, None, :], x, ahead)
        return super().forward(ahead, weight, bias, **kwargs)


class LeaksAcrossSamples(TorchKernel):
    """Ignores seq_idx: packed samples read their predecessor's tokens."""

    name = "leaks"

    def forward(self, x, weight, bias=None, **kwargs):
        kwargs["seq_idx"] = None
        return super().forward(x, weight, bias, **kwargs)


class ForwardOnly(TorchKernel):
    """Declares no backward: its fwd_bwd cases are skipped, not failed."""

    name = "forward_only"
    capabilities = Capabilities(features=FEATURES - {"backward"}, intermediate="input")


class Slow(TorchKernel):
    """Correct but takes SLOW_S per forward call, so a run can be killed half-way."""

    name = "slow"

    def forward(self, x, weight, bias=None, **kwargs):
        time.sleep(float(os.environ.get("SLOW_S", "0.4")))
        return super().forward(x, weight, bias, **kwargs)


class DbSpy(TorchKernel):
    """Correct, and fails loudly if its process holds the results database open.

    ``CONVMATRIX_SPY_DB`` names the SQLite file; workers must never open it (the controller
    is the single writer), so a worker that has it among its file descriptors raises.
    """

    name = "db_spy"

    def forward(self, x, weight, bias=None, **kwargs):
        target = Path(os.environ["CONVMATRIX_SPY_DB"]).resolve()
        fds = Path("/proc/self/fd")
        for fd in fds.iterdir():
            try:
                opened = Path(os.readlink(fd))
            except OSError:
                continue
            if opened == target or opened.name.startswith(target.name):
                raise AssertionError(f"pid {os.getpid()} holds the database open: {opened}")
        return super().forward(x, weight, bias, **kwargs)
