"""convmatrix: test matrix and regression service for causal depthwise conv1d kernels.

Data flow: matrix file → cases (``convmatrix.matrix``) → tensors on a device and kernel vs
float64 reference (``convmatrix.runners``, ``convmatrix.kernels``) → metrics → database
(``convmatrix.db``) → reports (``convmatrix.reports``).
"""

from convmatrix.kernels import Capabilities, ContractError, Geometry, Kernel, KernelBase, load

__version__ = "0.1.0"
__all__ = [
    "Capabilities",
    "ContractError",
    "Geometry",
    "Kernel",
    "KernelBase",
    "__version__",
    "load",
]
