"""Each known defect of the Triton interpreter, reproduced in a few lines with the installed
Triton (``convmatrix.kernels.adapters.triton_interpreter`` says what each one is and which
ones it works around).

A probe returns True when the defect is present. Probes are cheap (one tiny kernel each, a
few milliseconds interpreted), so the adapters run the ones with a workaround in their own
process before installing anything, and again after, to check the workaround took. They need
``TRITON_INTERPRET=1`` set before Triton was imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PROBES", "probe"]


def scalar_mask() -> bool:
    """A scalar comparison ``&`` a block mask, as a load mask (fla's ``compute_dh0_kernel``)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, out, T, N: tl.constexpr):
        o = tl.arange(0, N)
        for t in tl.static_range(0, 3):
            m = (t < T) & (o < N)
            tl.store(out + t * N + o, tl.load(x + t * N + o, mask=m, other=0.0), mask=o < N)

    x, out = torch.arange(12.0), torch.zeros(12)
    try:
        kernel[(1,)](x, out, 2, N=4)
    except Exception as exc:
        if "mask has unsupported dtype" not in str(exc):
            raise
        return True
    return out.tolist() != [*range(8), 0, 0, 0, 0]


def bf16_round() -> bool:
    """fp32 → bf16 truncates instead of rounding to nearest even."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, out, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(out + o, tl.load(x + o).to(tl.bfloat16))

    values = torch.randn(256, generator=torch.Generator().manual_seed(0))
    stored = torch.empty(256, dtype=torch.bfloat16)
    kernel[(1,)](values, stored, N=256)
    return not torch.equal(stored, values.to(torch.bfloat16))


def bf16_arith() -> bool:
    """bf16 (op) bf16 computed on the raw uint16 bit patterns (a product, a sum, a
    comparison)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(a, b, prod, total, less, N: tl.constexpr):
        o = tl.arange(0, N)
        x, y = tl.load(a + o), tl.load(b + o)
        tl.store(prod + o, x * y)
        tl.store(total + o, x + y)
        tl.store(less + o, (x < y).to(tl.int32))

    a = torch.tensor([1.5, 2.0, -3.0, 0.5], dtype=torch.bfloat16)
    b = torch.tensor([2.0, 0.25, 1.0, 4.0], dtype=torch.bfloat16)
    prod, total = torch.empty(4, dtype=torch.bfloat16), torch.empty(4, dtype=torch.bfloat16)
    less = torch.empty(4, dtype=torch.int32)
    kernel[(1,)](a, b, prod, total, less, N=4)
    right = (prod.tolist(), total.tolist(), less.tolist())
    return right != ((a * b).tolist(), (a + b).tolist(), (a < b).int().tolist())


def grid_meta() -> bool:
    """A grid callback cannot read a tensor argument or write to META."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, out, BD: tl.constexpr):
        tl.store(out + tl.program_id(0), BD)

    def reads_tensor(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(meta["x"].numel(), meta["BD"]),)

    def writes_meta(meta: dict[str, Any]) -> tuple[int]:
        meta["NB"] = triton.cdiv(8, meta["BD"])
        return (meta["NB"],)

    for grid in (reads_tensor, writes_meta):
        ids = torch.zeros(8, dtype=torch.int32)
        try:
            kernel[grid](torch.zeros(8), ids, BD=2)
        except Exception:
            return True
        if ids.tolist() != [2, 2, 2, 2, 0, 0, 0, 0]:
            return True
    return False


def _autotuned(configs: list[dict[str, int]]) -> Any:
    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config(c) for c in configs], key=[])
    @triton.jit
    def kernel(out, BD: tl.constexpr):
        tl.store(out + tl.program_id(0), BD)

    return kernel


def autotune() -> bool:
    """``@triton.autotune`` with several configs needs a GPU driver to benchmark them."""
    import torch

    try:
        _autotuned([{"BD": 2}, {"BD": 4}])[(1,)](torch.zeros(1, dtype=torch.int32))
    except Exception:
        return True
    return False


def autotune_decorate() -> bool:
    """Decorating a kernel with ``@triton.autotune`` asks for the GPU driver's benchmarker
    (Triton 3.3: ``RuntimeError: 0 active drivers``), so a module of autotuned kernels does
    not even import under the interpreter."""
    try:
        _autotuned([{"BD": 2}])
    except RuntimeError as exc:
        if "active drivers" not in str(exc):
            raise
        return True
    return False


def no_block_ptr() -> bool:
    """``tl.make_block_ptr`` does not run (Triton 3.9 removed block pointers: "Block pointers
    have been removed in favor of the tensor descriptor API", raised when a kernel runs)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, out, N: tl.constexpr):
        block = tl.make_block_ptr(x, (N,), (1,), (0,), (N,), (0,))
        tl.store(out + tl.arange(0, N), tl.load(block))

    x, out = torch.arange(4.0), torch.zeros(4)
    try:
        kernel[(1,)](x, out, N=4)
    except Exception:
        return True
    return not torch.equal(out, x)


def range_tensor() -> bool:
    """``for i in range(n)`` with ``n`` a loaded (runtime) value does not run (Triton 3.6's
    interpreter: "only 0-dimensional arrays can be converted to Python scalars")."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(n_ptr, out):
        n = tl.load(n_ptr)
        total = 0
        for i in range(n):
            total += i
        tl.store(out, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        kernel[(1,)](torch.tensor([4], dtype=torch.int32), out)
    except Exception:
        return True
    return out.item() != 6


PROBES: dict[str, Callable[[], bool]] = {
    "scalar_mask": scalar_mask,
    "bf16_round": bf16_round,
    "bf16_arith": bf16_arith,
    "grid_meta": grid_meta,
    "autotune": autotune,
    "autotune_decorate": autotune_decorate,
    "no_block_ptr": no_block_ptr,
    "range_tensor": range_tensor,
}


def probe(names: list[str] | None = None) -> dict[str, Any]:
    """{defect: present} for ``names`` (default all), with the Triton version."""
    import triton

    chosen = list(PROBES) if names is None else names
    return {"triton": triton.__version__, **{name: PROBES[name]() for name in chosen}}
