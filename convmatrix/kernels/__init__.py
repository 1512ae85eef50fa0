"""Kernels under test, the float64 oracle and the framework path (docs/spec.md §2).

- ``protocol``: what a kernel implements (``Kernel``, ``KernelBase``); its declared contract
  (``Capabilities``, ``Geometry``, ``StateLens``, ``ContractError``) is plain data in
  ``convmatrix.core``;
- ``registry``: kernels by name (entry points ``convmatrix.kernels``) or module:attribute;
- ``reference`` (the float64 oracle), ``framework`` (the ``torch`` path), ``tiled`` (the
  seed's MLU design), adapters (``dao``, ``mlu_vllm``, ``mlu_fla``) and helpers.

Names are imported on first use, so that light modules here (``planner``) stay free of torch.
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
    "CoreArgs": "convmatrix.kernels.corecall",
    "Kernel": "convmatrix.kernels.protocol",
    "KernelBase": "convmatrix.kernels.protocol",
    "KernelSpecError": "convmatrix.kernels.registry",
    "StateLens": "convmatrix.core.contract",
    "list_kernels": "convmatrix.kernels.registry",
    "load": "convmatrix.kernels.registry",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
