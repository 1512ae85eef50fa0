"""Running Triton kernels on a CPU: the Triton interpreter, and what it gets wrong.

Triton compiles kernels for GPUs only; with ``TRITON_INTERPRET=1`` every ``@triton.jit``
function becomes an ``InterpretedFunction`` that runs each program of the grid in Python,
block values held as numpy arrays. The flag is read when a kernel is *decorated*, i.e. when
the module defining it is imported, so it must be in the environment before the kernel
library (and, to be safe, Triton itself) is imported. ``enable()`` sets it; adapters call it
lazily, only on machines without a CUDA device, so importing convmatrix never changes how
Triton behaves for anyone else, and a GPU machine keeps compiled kernels.

Interpreter defects checked against Triton 3.9.0 (``probe()`` reproduces each one in a few
lines; ``tests/test_fla.py`` runs it in a fresh interpreter process and fails when a Triton
release changes the answer, so the gates below get revisited):

- ``scalar_mask``: a comparison of *scalars* (``t < T`` with ``T`` a kernel argument or a
  loaded value) yields a handle tagged int32 (``InterpreterBuilder.binary_op`` tags results
  with the left operand's type); combined with a block mask (``(t < T) & m_d``) it is splatted
  to an int32 array, and ``tl.load``/``tl.store`` refuse it: ``ValueError: mask has
  unsupported dtype``. fla's ``compute_dh0_kernel`` (every backward with an initial state)
  builds such a mask. Workaround (``_bool_masks``): masked loads and stores take ``mask != 0``
  (exact: a mask is a truth value). Applied for Triton < ``SCALAR_MASK_FIXED_IN``.
- ``bf16_round``: converting fp32 to bfloat16 (``x.to(tl.bfloat16)``, a bf16 store, also
  ``tl.cast(..., fp_downcast_rounding='rtne')``, the default) truncates toward zero
  (``InterpreterBuilder.cast_impl`` calls ``_convert_float`` without a rounding mode); compiled
  Triton rounds to nearest even. Every bf16 output of an interpreted kernel is then off by up
  to one ulp instead of half, about twice the error the same kernel has on a GPU, and a
  kernel would be blamed for it (measured with fla on ``nightly``: bf16 y/dx/dS errors 2-2.7x
  the PyTorch path's, 1.0-1.1x with the workaround). Workaround (``_rtne_bf16``): fp32 → bf16
  rounds to nearest even (NaN kept quiet). Applied for Triton < ``BF16_ROUND_FIXED_IN``.
- ``bf16_mul``: bfloat16 blocks are stored as raw uint16 bit patterns and an operation whose
  operands are *both* bfloat16 runs numpy on the bits (1.5 * 2.0 = 0.0). Triton's type
  promotion turns bf16 with any other type into fp32 first, so only bf16 (op) bf16 is hit; the
  fla kernels used here never do that (measured: no such operation executes in their forward,
  backward, varlen, state or update kernels), so no workaround is carried; a test instruments
  the interpreter to keep it that way.
- ``grid_meta``: the grid callback receives the kernel's arguments with tensors already
  turned into interpreter pointers (reading ``meta['x'].numel()`` fails) and the same dict is
  passed on as keyword arguments (writing ``meta['NB']`` makes the launch fail). fla's conv
  grids only read the constexpr ``meta['BD']``, which works: no workaround.
- ``autotune``: ``@triton.autotune`` with more than one config benchmarks them through the
  active GPU driver, which the interpreter does not have (``RuntimeError: 0 active drivers``);
  interpreting every config would also multiply the (slow) run time. ``force_single_config``
  keeps one config per autotuned kernel.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "BF16_ROUND_FIXED_IN",
    "ENV",
    "SCALAR_MASK_FIXED_IN",
    "apply_workarounds",
    "autotuners",
    "enable",
    "force_single_config",
    "interpreting",
    "is_interpreted",
    "needs_bf16_round_workaround",
    "needs_mask_workaround",
    "probe",
    "version_tuple",
]

ENV = "TRITON_INTERPRET"
# First Triton release assumed to have fixed the scalar-mask bug. Seen in 3.9.0, the newest
# release at the time of writing; the probe test says when this needs moving.
SCALAR_MASK_FIXED_IN = (3, 10)
BF16_ROUND_FIXED_IN = (3, 10)  # likewise for the truncating fp32 -> bf16 conversion


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def interpreting() -> bool:
    """Whether Triton kernels decorated from now on are interpreted (the env flag)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "on", "yes")


def enable() -> str | None:
    """Turn the interpreter on for kernels imported from now on. None, or why it is too late.

    Only called where no CUDA device exists: there compiled Triton cannot run at all, so the
    flag takes nothing away. An explicit ``TRITON_INTERPRET=0`` from the user is respected.
    """
    if os.environ.get(ENV, "").strip() in ("0", "false", "off", "no"):
        return f"{ENV}=0 is set and there is no CUDA device: Triton kernels cannot run here"
    os.environ[ENV] = "1"
    return None


def is_interpreted(kernel: Any) -> bool:
    """Whether a (possibly autotuned / heuristics-wrapped) Triton kernel is interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    seen = 0
    while kernel is not None and seen < 8:
        if isinstance(kernel, InterpretedFunction):
            return True
        kernel, seen = getattr(kernel, "fn", None), seen + 1
    return False


def autotuners(module: Any) -> list[Any]:
    """Every ``Autotuner`` wrapped (under heuristics) in a module-level kernel of ``module``."""
    from triton.runtime.autotuner import Autotuner

    found = []
    for value in vars(module).values():
        kernel, depth = value, 0
        while kernel is not None and depth < 8 and not isinstance(kernel, Autotuner):
            kernel, depth = getattr(kernel, "fn", None), depth + 1
        if isinstance(kernel, Autotuner) and all(kernel is not f for f in found):
            found.append(kernel)
    return found


def force_single_config(tuners: Iterable[Any], **prefer: Any) -> dict[str, dict[str, Any]]:
    """Keep one config per autotuner: the first whose kwargs match ``prefer`` where they
    name the same keys, else the first. Returns {kernel name: kept kwargs}."""
    kept = {}
    for tuner in tuners:
        configs = list(tuner.configs)

        def fits(config: Any) -> bool:
            return all(config.kwargs.get(k, v) == v for k, v in prefer.items())

        choice = next((c for c in configs if fits(c)), configs[0])
        tuner.configs = [choice]
        name = getattr(getattr(tuner, "base_fn", None), "__name__", repr(tuner))
        kept[name] = dict(choice.kwargs)
    return kept


def needs_mask_workaround(version: tuple[int, ...]) -> bool:
    return version < SCALAR_MASK_FIXED_IN


def needs_bf16_round_workaround(version: tuple[int, ...]) -> bool:
    return version < BF16_ROUND_FIXED_IN


_APPLIED: list[str] = []


def apply_workarounds(version: tuple[int, ...]) -> list[str]:
    """Install the version-gated interpreter workarounds once; returns their names."""
    if _APPLIED:
        return list(_APPLIED)
    if needs_mask_workaround(version):
        _bool_masks()
        _APPLIED.append("scalar_mask")
    if needs_bf16_round_workaround(version):
        _rtne_bf16()
        _APPLIED.append("bf16_round")
    return list(_APPLIED)


def _bool_masks() -> None:
    """Masked loads/stores take ``mask != 0`` (see ``scalar_mask`` in the module docstring)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask: Any) -> Any:
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data != 0, mask.dtype.scalar)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store


def _rtne_bf16() -> None:
    """fp32 → bf16 rounds to nearest, ties to even (see ``bf16_round`` in the docstring)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if not (src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16):
            return cast(self, src, dst_type)
        values = np.asarray(src.data, dtype=np.float32)
        bits = values.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
        rounded = np.where(np.isnan(values), (bits >> 16) | np.uint32(0x40), rounded)
        return interpreter.TensorHandle(rounded.astype(np.uint16), dst_type.scalar)

    builder.cast_impl = cast_impl


# -- the probe: each defect in a few lines, run in a fresh process --------------------------


def probe() -> dict[str, Any]:
    """Reproduce each defect with the installed Triton, no workaround applied.

    Must run in a process where ``TRITON_INTERPRET=1`` was set before Triton was imported and
    ``apply_workarounds`` was never called. ``True`` = the defect is present.
    """
    if not interpreting() or _APPLIED:
        raise RuntimeError("probe() needs a fresh process with TRITON_INTERPRET=1")
    import torch
    import triton
    import triton.language as tl

    result: dict[str, Any] = {"triton": triton.__version__}

    @triton.jit
    def scalar_mask_kernel(x, out, T, N: tl.constexpr):
        o = tl.arange(0, N)
        for t in tl.static_range(0, 3):
            m = (t < T) & (o < N)  # scalar comparison & block mask
            tl.store(out + t * N + o, tl.load(x + t * N + o, mask=m, other=0.0), mask=o < N)

    x, out = torch.arange(12.0), torch.zeros(12)
    try:
        scalar_mask_kernel[(1,)](x, out, 2, N=4)
        result["scalar_mask"] = out.tolist() != [*range(8), 0, 0, 0, 0]
    except Exception as exc:
        if "mask has unsupported dtype" not in str(exc):
            raise
        result["scalar_mask"] = True

    @triton.jit
    def store_kernel(x, out, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(out + o, tl.load(x + o).to(tl.bfloat16))

    values = torch.randn(256, generator=torch.Generator().manual_seed(0))
    stored = torch.empty(256, dtype=torch.bfloat16)
    store_kernel[(1,)](values, stored, N=256)
    result["bf16_round"] = not torch.equal(stored, values.to(torch.bfloat16))

    @triton.jit
    def mul_kernel(a, b, out, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(out + o, tl.load(a + o) * tl.load(b + o))

    a = torch.tensor([1.5, 2.0, -3.0, 0.5], dtype=torch.bfloat16)
    b = torch.tensor([2.0, 0.25, 1.0, 4.0], dtype=torch.bfloat16)
    prod = torch.empty(4, dtype=torch.bfloat16)
    mul_kernel[(1,)](a, b, prod, N=4)
    result["bf16_mul"] = prod.tolist() != (a * b).tolist()

    @triton.jit
    def grid_kernel(x, out, BD: tl.constexpr):
        tl.store(out + tl.program_id(0), BD)

    def reads_tensor(meta):
        return (triton.cdiv(meta["x"].numel(), meta["BD"]),)

    def writes_meta(meta):
        meta["NB"] = triton.cdiv(8, meta["BD"])
        return (meta["NB"],)

    broken = []
    for name, grid in (("reads a tensor", reads_tensor), ("writes META", writes_meta)):
        ids = torch.zeros(8, dtype=torch.int32)
        try:
            grid_kernel[grid](torch.zeros(8), ids, BD=2)
            if ids.tolist() != [2, 2, 2, 2, 0, 0, 0, 0]:
                broken.append(name)
        except Exception:
            broken.append(name)
    result["grid_meta"] = bool(broken)

    @triton.autotune(configs=[triton.Config({"BD": 2}), triton.Config({"BD": 4})], key=[])
    @triton.jit
    def tuned_kernel(out, BD: tl.constexpr):
        tl.store(out + tl.program_id(0), BD)

    try:
        tuned_kernel[(1,)](torch.zeros(1, dtype=torch.int32))
        result["autotune"] = False
    except Exception:
        result["autotune"] = True
    return result


def _main(argv: list[str]) -> int:
    if argv != ["--probe"]:
        print(
            "usage: python -m convmatrix.kernels.adapters.triton_interpreter --probe",
            file=sys.stderr,
        )
        return 2
    os.environ[ENV] = "1"  # before probe() imports Triton
    print(json.dumps(probe()))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
