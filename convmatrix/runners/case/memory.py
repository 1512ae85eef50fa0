"""Peak memory of a kernel's call: what it added on its device (or to the process on the CPU).

``runners.case.execute`` measures the call only, not the inputs or the reference around it.

A device (CUDA, MLU): its backend's peak allocation statistics (``torch.cuda`` /
``torch.mlu``, through ``core.devices.backend_module``), reset before the case. CPU: the kernel's
high-water mark of resident memory (``VmHWM``), reset through ``/proc/self/clear_refs`` before
the case, minus the resident size at its start: this counts every allocation (torch's CPU
allocator, numpy, a C extension), which tracemalloc would not. ``None`` where neither works.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

from convmatrix.core.devices import backend_module

__all__ = ["PeakMemory"]

_MB = 1024 * 1024


def _status_kb(key: str) -> int | None:
    with contextlib.suppress(OSError, AttributeError):
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1))  # type: ignore[union-attr]
    return None


class PeakMemory:
    """``with PeakMemory(device) as m: ...`` then ``m.peak_mb`` (None: not measurable)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mb: float | None = None
        self._start = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type != "cpu":
            backend = backend_module(self.device.type)
            backend.reset_peak_memory_stats(self.device)
            self._start = backend.memory_allocated(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
            except OSError:
                self._start = -1
            else:
                self._start = (_status_kb("VmRSS") or 0) * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type != "cpu":
            peak = backend_module(self.device.type).max_memory_allocated(self.device)
            self.peak_mb = max(0, peak - self._start) / _MB
        elif self._start >= 0:
            hwm = _status_kb("VmHWM")
            if hwm is not None:
                self.peak_mb = max(0, hwm * 1024 - self._start) / _MB
