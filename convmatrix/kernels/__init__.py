"""Kernels under test and the float64 oracle they are judged against (docs/spec.md §2), by role:

- ``interface``: what a kernel implements (``Kernel``, ``KernelBase``), the semantics'
  contracts, and the registry that finds kernels by name (entry points ``convmatrix.kernels``),
  by a family's prefix (``seeded:NAME``; ``interface.registry.FAMILY_GROUP``) or
  ``package.module:attribute``; a kernel's declared contract (``Capabilities``, ``Geometry``,
  ``ContractError``) is plain data in ``convmatrix.core``;
- ``oracle``: the float64 reference, step by step for one case, a scalar reference, selfcheck;
- ``builtin``: the framework path ``torch``, ``tiled`` (the seed's MLU design), the planner;
- ``adapters``: real libraries (Dao, fla, vLLM, torch_mlu_ops);
- ``doubles``: seeded bugs, precision defects, slowed kernels, library stand-ins and the
  adapters over them.

Each role imports only the roles above it in this list (tests/test_roles.py).

Names are imported on first use, so that light modules (``builtin.planner``) stay free of torch.
"""

from __future__ import annotations

from convmatrix.core.lazy import lazy_attributes

__all__ = [
    "Capabilities",
    "ContractError",
    "CoreArgs",
    "Geometry",
    "Kernel",
    "KernelBase",
    "KernelSpecError",
    "StateLens",
    "list_kernels",
    "load",
]

_LAZY = {
    "Capabilities": "convmatrix.core.contract",
    "ContractError": "convmatrix.core.contract",
    "Geometry": "convmatrix.core.contract",
    "CoreArgs": "convmatrix.kernels.interface.corecall",
    "Kernel": "convmatrix.kernels.interface.protocol",
    "KernelBase": "convmatrix.kernels.interface.protocol",
    "KernelSpecError": "convmatrix.kernels.interface.registry",
    "StateLens": "convmatrix.core.contract",
    "list_kernels": "convmatrix.kernels.interface.registry",
    "load": "convmatrix.kernels.interface.registry",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
