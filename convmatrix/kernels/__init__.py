"""Kernels under test, the float64 oracle and the framework path (SPEC.md §2)."""

from convmatrix.kernels.corecall import CoreArgs
from convmatrix.kernels.protocol import (
    Capabilities,
    ContractError,
    Geometry,
    Kernel,
    KernelBase,
)
from convmatrix.kernels.registry import KernelSpecError, list_kernels, load

__all__ = [
    "Capabilities",
    "ContractError",
    "CoreArgs",
    "Geometry",
    "Kernel",
    "KernelBase",
    "KernelSpecError",
    "list_kernels",
    "load",
]
