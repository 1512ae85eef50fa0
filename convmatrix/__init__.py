"""convmatrix: test matrix and regression service for causal depthwise conv1d kernels.

Data flow: matrix file → cases (``convmatrix.matrix``) → tensors on a device and kernel vs
float64 reference (``convmatrix.runners``, ``convmatrix.kernels``) → metrics → database
(``convmatrix.db``) → reports (``convmatrix.reports``); the records and rules they share are
``convmatrix.core``. ``docs/architecture.md`` walks one case through all of them.

The public names below are imported on first use (PEP 562), so ``import convmatrix`` and the
``convmatrix`` command stay fast and import torch only when a command needs tensors.
"""

from __future__ import annotations

import os

# Transparent huge pages for torch's large CPU tensors: a C=4128, L=4096 case still makes
# fresh tensors of hundreds of MB (inputs, kernel outputs, the kept reference), and with 4 KiB
# pages their page faults cost more than the arithmetic. Measured on the 2-core host: 9.9 s
# without and 8.4 s with it for one such case; 34 s and 17 s before the harness judged in
# channel blocks (benchmarks/bench_blocks.py). c10 reads the variable once, at torch's first
# allocation, so it must be set before torch is imported; worker processes inherit it.
# THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from convmatrix.core import __version__
from convmatrix.core.lazy import lazy_attributes

__all__ = [
    "Capabilities",
    "ContractError",
    "Geometry",
    "Kernel",
    "KernelBase",
    "RunSummary",
    "__version__",
    "load",
    "run",
]

_LAZY = {
    "Capabilities": "convmatrix.core.contract",
    "ContractError": "convmatrix.core.contract",
    "Geometry": "convmatrix.core.contract",
    "Kernel": "convmatrix.kernels.protocol",
    "KernelBase": "convmatrix.kernels.protocol",
    "RunSummary": "convmatrix.runners.summary",
    "load": "convmatrix.kernels.registry",
    "run": "convmatrix.api",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
