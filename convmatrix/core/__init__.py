"""The records and rules every layer shares, beneath all of them (no torch at import).

``Case`` (one check, with its stable id), the results a case produces and the run they
belong to (``records``), the dtype tables, the tolerance table and policy, the one verdict
(``verdict``: which dtype judges an output, pass/fail, severity, the failure text), a kernel's
declared contract (``contract``), memory layouts, errors that end a command cleanly, and the
device layer (``convmatrix.core.devices``, which imports torch and is therefore not
re-exported here).

The names load on first use (``core.lazy``): ``import convmatrix`` imports this package, and
a command that reads the database needs none of them at start-up.
"""

from convmatrix.core.lazy import lazy_attributes

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

_LAZY = {
    **dict.fromkeys(("Case",), "convmatrix.core.case"),
    **dict.fromkeys(
        ("Capabilities", "ContractError", "Geometry", "StateLens"), "convmatrix.core.contract"
    ),
    **dict.fromkeys(("ConvmatrixError", "UsageError"), "convmatrix.core.errors"),
    **dict.fromkeys(
        (
            "BAD_OUTCOMES",
            "OUTCOMES",
            "CaseResult",
            "ErrorMetrics",
            "OutputMetrics",
            "PropertyResult",
            "RunMeta",
            "TimingResult",
        ),
        "convmatrix.core.records",
    ),
    **dict.fromkeys(("OUTPUTS", "Policy", "Tolerance", "Tolerances"), "convmatrix.core.tolerances"),
}
__getattr__ = lazy_attributes(__name__, _LAZY)
