"""convmatrix: test matrix and regression service for causal depthwise conv1d kernels.

Data flow: matrix file → cases (``convmatrix.matrix``) → tensors on a device and kernel vs
float64 reference (``convmatrix.runners``, ``convmatrix.kernels``) → metrics → database
(``convmatrix.db``) → reports (``convmatrix.reports``); the records and rules they share are
``convmatrix.core``. ``docs/architecture.md`` walks one case through all of them.

The public names below are imported on first use (PEP 562), so ``import convmatrix`` and the
``convmatrix`` command stay fast and import torch only when a command needs tensors.
"""

from __future__ import annotations

from convmatrix.core import __version__
from convmatrix.core.lazy import lazy_attributes
from convmatrix.core.moved import install as _install_moved_paths

_install_moved_paths()  # module paths of earlier releases keep importing (core/moved.py)

__all__ = [
    "Capabilities",
    "ContractError",
    "Geometry",
    "Kernel",
    "KernelBase",
    "RunAccount",
    "__version__",
    "load",
    "run",
]

_LAZY = {
    "Capabilities": "convmatrix.core.contract",
    "ContractError": "convmatrix.core.contract",
    "Geometry": "convmatrix.core.contract",
    "Kernel": "convmatrix.kernels.interface.protocol",
    "KernelBase": "convmatrix.kernels.interface.protocol",
    "RunAccount": "convmatrix.runners.run.account",
    "load": "convmatrix.kernels.interface.registry",
    "run": "convmatrix.api",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
