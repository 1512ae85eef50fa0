"""Dtype spellings: one rule (``core.dtypes.case_dtype``) for every door that reads a dtype."""

from __future__ import annotations

import pytest

from convmatrix.core.dtypes import (
    CASE_DTYPES,
    ITEMSIZE,
    case_dtype,
    parse_case_dtype,
    parse_dtype_pair,
)
from convmatrix.core.errors import UsageError


@pytest.mark.parametrize(
    "spelling, dtype",
    [
        ("bfloat16", "bfloat16"), ("BF16", "bfloat16"), ("bf16", "bfloat16"),
        (" torch.bfloat16 ", "bfloat16"), ("f16", "float16"), ("FP16", "float16"),
        ("half", "float16"), ("float", "float32"), ("f32", "float32"), ("Float32", "float32"),
    ],
)  # fmt: skip
def test_every_spelling_names_its_case_dtype(spelling, dtype):
    assert case_dtype(spelling) == dtype
    assert parse_case_dtype(spelling) == dtype


@pytest.mark.parametrize("text", ["float64", "f64", "int8", "", "bf 16"])
def test_what_is_not_a_case_dtype_is_refused_naming_the_argument(text):
    assert case_dtype(text) is None
    with pytest.raises(UsageError, match=r"--where .*not a case dtype"):
        parse_case_dtype(text, "--where")


def test_pairs_are_x_then_weight_and_one_name_means_both():
    assert parse_dtype_pair("BF16/fp32") == ("bfloat16", "float32")
    assert parse_dtype_pair("f16") == ("float16", "float16")
    with pytest.raises(UsageError, match="expected X or X/W"):
        parse_dtype_pair("bf16/fp32/fp16")


def test_sizes_cover_every_case_dtype():
    assert {d: ITEMSIZE[d] for d in CASE_DTYPES} == {"float32": 4, "float16": 2, "bfloat16": 2}
