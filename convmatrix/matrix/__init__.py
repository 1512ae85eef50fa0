"""The YAML matrix language: load a matrix, expand it into cases for a kernel.

spec = load_matrix("nightly")            # or a path; MatrixError (exit 2) when malformed
expansion = expand_matrix(spec, kernel)  # symbols resolve against the kernel's geometry
for case in expansion.cases: ...         # frozen Case values with stable ids
"""

from convmatrix.core.case import Case
from convmatrix.core.tolerances import DEFAULT_TOLERANCES, OUTPUTS, Policy, Tolerance, Tolerances
from convmatrix.matrix.coverage import Coverage, coverage
from convmatrix.matrix.errors import MatrixError
from convmatrix.matrix.expand import Expansion, expand_matrix
from convmatrix.matrix.loader import builtin_names, load_matrix
from convmatrix.matrix.spec import MatrixSpec, SuiteSpec, TimingSettings

__all__ = [
    "DEFAULT_TOLERANCES",
    "OUTPUTS",
    "Case",
    "Coverage",
    "Expansion",
    "MatrixError",
    "MatrixSpec",
    "Policy",
    "SuiteSpec",
    "TimingSettings",
    "Tolerance",
    "Tolerances",
    "builtin_names",
    "coverage",
    "expand_matrix",
    "load_matrix",
]
