"""Running Triton kernels on a CPU: the Triton interpreter, and what it gets wrong.

Triton compiles kernels for GPUs only; with ``TRITON_INTERPRET=1`` every ``@triton.jit``
function becomes an ``InterpretedFunction`` that runs each program of the grid in Python,
block values held as numpy arrays. The flag is read when a kernel is *decorated*, i.e. when
the module defining it is imported, so it must be in the environment before the kernel
library (and, to be safe, Triton itself) is imported. ``enable()`` sets it; adapters call it
lazily, only on machines without a CUDA device, so importing convmatrix never changes how
Triton behaves for anyone else, and a GPU machine keeps compiled kernels.

Interpreter defects, each reproduced in a few lines by ``triton_probes`` (seen in Triton 3.6
and 3.9; ``python -m convmatrix.kernels.adapters.triton_interpreter --probe`` prints the
answers of the installed Triton). A workaround is installed when its probe, run in the
adapter's own process before anything is installed, finds the defect, and is checked by the
same probe afterwards: no version ranges, so a Triton release that fixes one (or brings it
back) is handled by what it does.

- ``scalar_mask``: a comparison of *scalars* (``t < T`` with ``T`` a kernel argument or a
  loaded value) yields a handle tagged int32 (``InterpreterBuilder.binary_op`` tags results
  with the left operand's type); combined with a block mask (``(t < T) & m_d``) it is splatted
  to an int32 array, and ``tl.load``/``tl.store`` refuse it: ``ValueError: mask has
  unsupported dtype``. fla's ``compute_dh0_kernel`` (every backward with an initial state)
  builds such a mask. Workaround (``_bool_masks``): masked loads and stores take ``mask != 0``
  (exact: a mask is a truth value). Triton 3.6 does not have this defect; 3.9 does.
- ``bf16_round``: converting fp32 to bfloat16 (``x.to(tl.bfloat16)``, a bf16 store, also
  ``tl.cast(..., fp_downcast_rounding='rtne')``, the default) truncates toward zero
  (``InterpreterBuilder.cast_impl`` calls ``_convert_float`` without a rounding mode); compiled
  Triton rounds to nearest even. Every bf16 output of an interpreted kernel is then off by up
  to one ulp instead of half, about twice the error the same kernel has on a GPU, and a
  kernel would be blamed for it (measured with fla on ``nightly``: bf16 y/dx/dS errors 2-2.7x
  the PyTorch path's, 1.0-1.1x with the workaround). Workaround (``_rtne_bf16``): fp32 → bf16
  rounds to nearest even (NaN kept quiet). Present in 3.6 and 3.9.
- ``bf16_arith``: bfloat16 blocks are stored as raw uint16 bit patterns and an operation
  whose operands are *both* bfloat16 runs numpy on the bits (1.5 * 2.0 = 0.0). Triton's type
  promotion turns bf16 with any other type into fp32 first, so only bf16 (op) bf16 is hit:
  never in fla's conv kernels (instrumented by tests/test_fla.py), but vLLM's computes in the
  state dtype (``acc += x * w`` on bf16 blocks; its bf16 x bf16 cases fail with inf errors
  without this). Workaround (``_bf16_arith``): such an operation is computed on the fp32
  values and the result rounded to nearest even, as a GPU's bf16 arithmetic rounds each
  operation once; a comparison gets the fp32 comparison's truth values. Present in 3.6 and
  3.9.
- ``grid_meta``: the grid callback receives the kernel's arguments with tensors already
  turned into interpreter pointers (reading ``meta['x'].numel()`` fails) and the same dict is
  passed on as keyword arguments (writing ``meta['NB']`` makes the launch fail). Compiled
  Triton calls the grid with the launch's own arguments (torch tensors) and launches with
  what the grid left in that dict, which vLLM's forward relies on (its grid sizes and fills
  ``META['batch_ptr']``). Workaround (``_compiled_grid``): a callable grid is evaluated
  before the interpreter sees the launch, on a dict of the kernel's parameters as passed,
  and the launch takes the parameters from that dict afterwards (keys that are not
  parameters are dropped, as a compiled launch has no place for them). fla's grids read only
  ``meta['BD']``, which both ways give alike.
- ``autotune_decorate``: Triton 3.3's ``Autotuner`` asks the driver for its benchmarker when
  a kernel is *decorated*, so a module of autotuned kernels (fla's) does not import under the
  interpreter (``RuntimeError: 0 active drivers``). Workaround
  (``_autotune_without_driver``): an autotuner made without a benchmarker gets one that
  raises if ever called (with one config kept, it never is). Absent in 3.6 and 3.9. Being a
  decoration-time defect, its workaround must be in place before the kernels are imported:
  adapters call ``apply_workarounds`` first.
- ``autotune``: ``@triton.autotune`` with more than one config benchmarks them through the
  active GPU driver, which the interpreter does not have (``RuntimeError: 0 active drivers``);
  interpreting every config would also multiply the (slow) run time. ``force_single_config``
  keeps one config per autotuned kernel.

The wrappers take the mask (or the source of a cast) wherever the builder's signature puts
it and pass every other argument through: ``create_masked_load`` gained an argument between
3.6 (``cache_modifier, eviction_policy``) and 3.9 (``cache_policy``).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "ENV",
    "apply_workarounds",
    "autotuners",
    "enable",
    "force_single_config",
    "interpreting",
    "is_interpreted",
]

ENV = "TRITON_INTERPRET"


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


_APPLIED: dict[str, str] = {}


def apply_workarounds() -> dict[str, str]:
    """Probe each defect that has a workaround and install the workaround where the defect is
    present, once per process; {defect: "absent" | "worked around"}. Raises ``RuntimeError``
    when a workaround did not take (the probe still finds the defect), naming it."""
    from convmatrix.kernels.adapters.triton_probes import PROBES

    if not interpreting():
        raise RuntimeError(f"apply_workarounds() needs {ENV}=1 set before Triton is imported")
    if _APPLIED:
        return dict(_APPLIED)
    for name, install in _WORKAROUNDS.items():
        if not PROBES[name]():
            _APPLIED[name] = "absent"
            continue
        install()
        if PROBES[name]():
            raise RuntimeError(f"the {name} workaround did not take under this Triton")
        _APPLIED[name] = "worked around"
    return dict(_APPLIED)


def _replacing(original: Callable[..., Any], name: str, fix: Callable[[Any], Any]) -> Any:
    """``original`` with its argument ``name`` passed through ``fix``, wherever the signature
    puts it (positional or keyword); every other argument passes as it came."""
    position = list(inspect.signature(original).parameters).index(name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name in kwargs:
            kwargs[name] = fix(kwargs[name])
        elif position < len(args):
            args = (*args[:position], fix(args[position]), *args[position + 1 :])
        return original(*args, **kwargs)

    return wrapper


def _bool_masks() -> None:
    """Masked loads/stores take ``mask != 0`` (see ``scalar_mask`` in the module docstring)."""
    import numpy as np
    from triton.runtime import interpreter

    def as_bool(mask: Any) -> Any:
        if mask is None or mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data != 0, mask.dtype.scalar)

    builder = interpreter.InterpreterBuilder
    for method in ("create_masked_load", "create_masked_store"):
        setattr(builder, method, _replacing(getattr(builder, method), "mask", as_bool))


def _bf16_bits(values: Any) -> Any:
    """fp32 numpy values → bf16 bit patterns (uint16), rounded to nearest even, NaN quiet."""
    import numpy as np

    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return np.where(np.isnan(values), (bits >> 16) | np.uint32(0x40), rounded).astype(np.uint16)


def _bf16_arith() -> None:
    """bf16 (op) bf16 on the fp32 values (see ``bf16_arith`` in the module docstring)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    binary = builder.binary_op
    params = list(inspect.signature(binary).parameters)  # (self, lhs, rhs, op) so far

    def as_fp32(handle: Any) -> Any:
        return (np.asarray(handle.data).astype(np.uint32) << 16).view(np.float32)

    def binary_op(*args: Any, **kwargs: Any) -> Any:
        bound = {**dict(zip(params, args, strict=False)), **kwargs}
        lhs, rhs, op = bound["lhs"], bound["rhs"], bound["op"]
        result = binary(*args, **kwargs)
        if lhs.dtype.scalar != tl.bfloat16 or rhs.dtype.scalar != tl.bfloat16:
            return result
        exact = op(as_fp32(lhs), as_fp32(rhs))
        data = exact if exact.dtype == np.bool_ else _bf16_bits(exact)
        return interpreter.TensorHandle(data, result.dtype)

    builder.binary_op = binary_op


def _rtne_bf16() -> None:
    """fp32 → bf16 rounds to nearest, ties to even (see ``bf16_round`` in the docstring)."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl
    params = list(inspect.signature(cast).parameters)  # (self, src, dst_type) so far

    def cast_impl(*args: Any, **kwargs: Any) -> Any:
        bound = {**dict(zip(params, args, strict=False)), **kwargs}
        src, dst_type = bound["src"], bound["dst_type"]
        if not (src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16):
            return cast(*args, **kwargs)
        return interpreter.TensorHandle(_bf16_bits(src.data), dst_type.scalar)

    builder.cast_impl = cast_impl


def _compiled_grid() -> None:
    """A callable grid sees and may change the launch's arguments, as compiled Triton's
    does (see ``grid_meta`` in the module docstring). ``GridExecutor`` runs every interpreted
    launch from Triton 3.3 to 3.9 (``InterpretedFunction.run`` is a per-instance closure in
    3.3), so the grid is evaluated there, before the arguments become pointers."""
    from triton.runtime.interpreter import GridExecutor

    call = GridExecutor.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        grid = self.grid
        if not callable(grid):
            return call(self, *args, **kwargs)
        names = list(self.arg_names)
        meta = dict(zip(names, args, strict=False)) | {
            k: v for k, v in kwargs.items() if k in names
        }
        self.grid = tuple(grid(meta))
        options = {k: v for k, v in kwargs.items() if k not in names}
        try:
            return call(self, **options, **{k: meta[k] for k in names if k in meta})
        finally:
            self.grid = grid

    GridExecutor.__call__ = __call__


def _autotune_without_driver() -> None:
    """``Autotuner`` gets a benchmarker that is never the driver's (see
    ``autotune_decorate`` in the module docstring): with one config kept there is nothing to
    benchmark, and asking for it says why it cannot."""
    from triton.runtime.autotuner import Autotuner

    init = Autotuner.__init__
    position = list(inspect.signature(init).parameters).index("do_bench")

    def no_bench(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("autotuning benchmarks on a GPU; keep one config under the interpreter")

    def __init__(*args: Any, **kwargs: Any) -> None:
        if position < len(args):
            if args[position] is None:
                args = (*args[:position], no_bench, *args[position + 1 :])
        elif kwargs.get("do_bench") is None:
            kwargs["do_bench"] = no_bench
        init(*args, **kwargs)

    Autotuner.__init__ = __init__


_WORKAROUNDS: dict[str, Callable[[], None]] = {
    "autotune_decorate": _autotune_without_driver,
    "scalar_mask": _bool_masks,
    "bf16_round": _rtne_bf16,
    "bf16_arith": _bf16_arith,
    "grid_meta": _compiled_grid,
}


def _main(argv: list[str]) -> int:
    if argv != ["--probe"]:
        print(
            "usage: python -m convmatrix.kernels.adapters.triton_interpreter --probe",
            file=sys.stderr,
        )
        return 2
    os.environ[ENV] = "1"  # before the probes import Triton
    from convmatrix.kernels.adapters.triton_probes import probe

    print(json.dumps(probe()))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
