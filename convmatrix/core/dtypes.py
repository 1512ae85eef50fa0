"""The dtype tables every layer shares: names, spellings, sizes, unit roundoffs, coarseness.

Dtypes travel through convmatrix as canonical names (``"bfloat16"``), never as torch objects,
so that the matrix language, the database and the reports work without importing torch;
``torch_dtype`` turns a name into the torch object where tensors are made.
"""

from __future__ import annotations

from typing import Any

from convmatrix.core.errors import InputError

__all__ = [
    "ALIASES",
    "CASE_DTYPES",
    "ITEMSIZE",
    "UNIT_ROUNDOFF",
    "canonical_dtype",
    "case_dtype",
    "coarser",
    "parse_case_dtype",
    "parse_dtype_pair",
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


def case_dtype(name: object) -> str | None:
    """The case dtype a spelling names (``BF16``, ``f16``, ``torch.float32``, ``half``...);
    None for anything else, float64 included (the reference's, never a case's). Every command,
    matrix key and served URL reads dtypes through here, so they all take the same spellings."""
    if not isinstance(name, str):
        return None
    dtype = canonical_dtype(name.strip().removeprefix("torch."))
    return dtype if dtype in CASE_DTYPES else None


def _spellings() -> str:
    return f"{', '.join(CASE_DTYPES)} (or bf16, fp16, f16, half, fp32, f32, float)"


def parse_case_dtype(text: str, what: str = "--dtype") -> str:
    """``case_dtype`` or a ``UsageError`` naming the argument ``what``."""
    dtype = case_dtype(text)
    if dtype is None:
        raise InputError(f"{what} {text!r}: not a case dtype; one of {_spellings()}")
    return dtype


def parse_dtype_pair(text: str, what: str = "--dtype") -> tuple[str, str]:
    """``"bfloat16/float32"`` (x dtype / weight dtype; one name means both) → case dtypes."""
    parts = [p.strip() for p in text.split("/")]
    if len(parts) > 2 or not all(parts):
        raise InputError(f"{what} {text!r}: expected X or X/W, e.g. bfloat16/float32")
    names = [parse_case_dtype(p, what) for p in parts]
    return names[0], names[-1]


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
