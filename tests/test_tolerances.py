"""The default tolerance table (``convmatrix.core.tolerances``) pinned to values written here:
any change to it, looser or tighter, has to change this test too (and docs/spec.md §4).

Rows, by the dtype an output is judged in: e_rel <= 32 u and e_norm <= 8 u for the forward
outputs (y, F, dx, dS, state), 4x both for dw and db, where u is the unit roundoff (2^-24 fp32,
2^-11 fp16, 2^-8 bf16) floored at fp32's (float64 results still accumulate in fp32). All of
them are powers of two, written out exactly.
"""

from __future__ import annotations

from convmatrix.core.tolerances import DEFAULT_TOLERANCES, Tolerance, Tolerances

# dtype -> (rel, norm) of y, F, dx, dS, state
FORWARD = {
    "float32": (1.9073486328125e-06, 4.76837158203125e-07),  # 2^-19, 2^-21
    "float64": (1.9073486328125e-06, 4.76837158203125e-07),  # fp32's floor
    "float16": (0.015625, 0.00390625),  # 2^-6, 2^-8
    "bfloat16": (0.125, 0.03125),  # 2^-3, 2^-5
}
# dtype -> (rel, norm) of dw, db
PARAM_GRADS = {
    "float32": (7.62939453125e-06, 1.9073486328125e-06),  # 2^-17, 2^-19
    "float64": (7.62939453125e-06, 1.9073486328125e-06),
    "float16": (0.0625, 0.015625),  # 2^-4, 2^-6
    "bfloat16": (0.5, 0.125),  # 2^-1, 2^-3
}
EXPECTED = {
    (dtype, output): Tolerance(*(PARAM_GRADS if output in ("dw", "db") else FORWARD)[dtype])
    for dtype in FORWARD
    for output in ("y", "F", "dx", "dw", "db", "dS", "state")
}


def test_the_default_table_is_pinned():
    assert dict(DEFAULT_TOLERANCES) == EXPECTED


def test_a_matrix_without_rows_gets_the_pinned_defaults():
    tolerances = Tolerances()
    assert tolerances.lookup("float32", "dx") == Tolerance(
        1.9073486328125e-06, 4.76837158203125e-07
    )
    assert tolerances.lookup("bfloat16", "db") == Tolerance(0.5, 0.125)
