"""The dtype tables every layer shares: names, spellings, sizes, unit roundoffs, coarseness.

Dtypes travel through convmatrix as canonical names (``"bfloat16"``), never as torch objects,
so that the matrix language, the database and the reports work without importing torch;
``torch_dtype`` turns a name into the torch object where tensors are made.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ALIASES",
    "CASE_DTYPES",
    "ITEMSIZE",
    "UNIT_ROUNDOFF",
    "canonical_dtype",
    "coarser",
    "short_name",
    "torch_dtype",
]

# Storage dtypes a case's x, weight and state may have (docs/spec.md §3 "parameters").
CASE_DTYPES = ("float32", "float16", "bfloat16")
# Every dtype convmatrix knows: the case dtypes and the reference's float64.
_ALL = (*CASE_DTYPES, "float64")

ALIASES = {
    **{d: d for d in _ALL},
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "f64": "float64",
    "double": "float64",
}

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

# Unit roundoff (half an ulp at 1.0) of each storage dtype.
UNIT_ROUNDOFF = {
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float64": 2.0**-53,
}

# From finest to coarsest: bfloat16 has fewer mantissa bits than float16.
_COARSENESS = ("float64", "float32", "float16", "bfloat16")
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}


def canonical_dtype(name: str) -> str | None:
    """``bf16`` → ``bfloat16`` (any known spelling, case-insensitive); None when unknown."""
    return ALIASES.get(name.strip().lower())


def short_name(dtype: str) -> str:
    """``bfloat16`` → ``bf16``, for ids and labels (unknown names pass through)."""
    return _SHORT.get(dtype, dtype)


def coarser(a: str, b: str) -> str:
    """The coarser of two dtypes (the one with fewer mantissa bits)."""
    return max(a, b, key=_COARSENESS.index)


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` of a canonical name (imports torch: tensor code only)."""
    import torch

    return getattr(torch, name)
