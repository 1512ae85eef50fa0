"""The records and rules every layer shares, beneath all of them (no torch at import).

``Case`` (one check, with its stable id), the results a case produces and the run they
belong to (``records``), the dtype tables, the tolerance table and policy, the one verdict
(``verdict``: which dtype judges an output, pass/fail, severity, the failure text), a kernel's
declared contract (``contract``), memory layouts, errors that end a command cleanly, and the
device layer (``convmatrix.core.devices``, which imports torch and is therefore not
re-exported here).
"""

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities, ContractError, Geometry, StateLens
from convmatrix.core.errors import ConvmatrixError, UsageError
from convmatrix.core.records import (
    BAD_OUTCOMES,
    OUTCOMES,
    CaseResult,
    ErrorMetrics,
    OutputMetrics,
    PropertyResult,
    RunMeta,
    TimingResult,
)
from convmatrix.core.tolerances import OUTPUTS, Policy, Tolerance, Tolerances

__version__ = "0.1.0"

__all__ = [
    "BAD_OUTCOMES",
    "OUTCOMES",
    "OUTPUTS",
    "Capabilities",
    "Case",
    "CaseResult",
    "ContractError",
    "ConvmatrixError",
    "ErrorMetrics",
    "Geometry",
    "OutputMetrics",
    "Policy",
    "PropertyResult",
    "RunMeta",
    "StateLens",
    "TimingResult",
    "Tolerance",
    "Tolerances",
    "UsageError",
    "__version__",
]
