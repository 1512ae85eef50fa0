"""Loading fla once per process: its layout, the Triton interpreter, and the CPU-only gaps.

On a machine without CUDA the Triton interpreter is turned on before fla is imported
(``triton_interpreter.enable``: the flag is read when a kernel is decorated), the
interpreter's defects are probed and worked around (``triton_interpreter.apply_workarounds``),
one autotune config is kept per kernel (BD = 16, declared as the channel tile), and what old
fla asks of a GPU is bridged (``cpu_bridges``). Everything chosen is recorded in ``Loaded``
and stored with the run (``FlaKernel.describe``).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from convmatrix.kernels.adapters import triton_interpreter, triton_probes
from convmatrix.kernels.adapters.fla import cpu_bridges
from convmatrix.kernels.adapters.fla.layout import (
    Api,
    find_layout,
    fla_roots,
    import_conv,
    probe_api,
    tree_version,
)

__all__ = ["INTERPRETER_BD", "Loaded", "load"]

INTERPRETER_BD = 16  # the one channel-tile config kept under the interpreter


@dataclass
class Loaded:
    """What was loaded (or why nothing was), and every choice made on the way."""

    functions: Any = None  # the module with causal_conv1d
    update: Any = None  # the module with causal_conv1d_update
    api: Api | None = None
    reason: str | None = None
    interpreted: bool = False
    facts: dict[str, Any] = field(default_factory=dict)  # recorded with the run

    @property
    def time_tile(self) -> int | None:
        """The time tile every call really uses, when it is one number (module docstring of
        ``cpu_bridges``: old fla derives it from the SM count and B*T)."""
        if self.api is None:
            return None
        if self.api.chunk_size is not None:
            return self.api.chunk_size
        sm = self.facts.get("cpu_bridges", {}).get("sm_count", {}).get("sm_count")
        return 64 if sm == 1 else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _interpreter(loaded: Loaded) -> bool:
    """Turn the interpreter on where there is no CUDA device, and work around its defects,
    before fla is imported (the flag and some defects act when a kernel is decorated)."""
    if not torch.cuda.is_available():
        loaded.reason = triton_interpreter.enable()
        if loaded.reason:
            return False
    loaded.interpreted = triton_interpreter.interpreting()
    if loaded.interpreted:
        try:
            loaded.facts["interpreter_workarounds"] = triton_interpreter.apply_workarounds()
        except (ImportError, RuntimeError) as exc:  # no Triton; a workaround that did not take
            loaded.reason = f"Triton's interpreter: {type(exc).__name__}: {exc}"
            return False
    return True


@functools.cache
def load() -> Loaded:
    """Find, import and prepare fla once per process; never raises (the reason lands in
    ``Loaded.reason``, which the kernel's ``availability`` reports)."""
    loaded = Loaded(facts={"triton": _version("triton")})
    modules = _import(loaded)
    if modules is None:
        return loaded
    api = probe_api(modules)
    if isinstance(api, str):
        loaded.reason = api
        return loaded
    functions, update, kernels = modules
    loaded.reason = _needs_block_pointers(kernels)
    if loaded.reason or (loaded.interpreted and not _prepare_interpreted(loaded, kernels)):
        return loaded
    try:
        loaded.facts["cpu_bridges"] = cpu_bridges.install(modules)
    except ValueError as exc:  # CONVMATRIX_FLA_SM_COUNT is not a count
        loaded.reason = str(exc)
        return loaded
    loaded.functions, loaded.update, loaded.api = functions, update, api
    loaded.facts["time_tile"] = {"rule": api.tile_rule, "tile": loaded.time_tile}
    return loaded


def _import(loaded: Loaded) -> tuple[Any, Any, Any] | None:
    """fla's conv modules (``layout.import_conv``), the interpreter turned on first; None
    with ``loaded.reason`` set when there is no fla, no conv in it, or it does not import."""
    roots = fla_roots()
    if not roots:
        loaded.reason = (
            "fla is not importable (pip install 'convmatrix[fla]', or a checkout on PYTHONPATH)"
        )
        return None
    layout = find_layout(roots)
    loaded.facts.update(fla_path=str(roots[0]), fla_version=tree_version(roots))
    if layout is None:
        loaded.reason = (
            f"no causal conv1d in the fla at {roots[0]} "
            "(none of modules/causal_conv1d/, modules/conv/, modules/convolution.py)"
        )
        return None
    loaded.facts["layout"] = layout.name
    if not _interpreter(loaded):
        return None
    try:
        with warnings.catch_warnings():
            # fla warns "Triton is not supported on current platform" on a CPU: expected here.
            warnings.filterwarnings("ignore", message="Triton is not supported")
            modules = import_conv(layout, roots)
    except Exception as exc:  # no triton, a Triton too new or too old for this fla, ...
        loaded.reason = f"fla ({layout.name}) not importable: {type(exc).__name__}: {exc}"
        return None
    loaded.facts["modules"] = sorted({m.__name__ for m in modules})
    return modules


def _needs_block_pointers(kernels: Any) -> str | None:
    """Why this fla cannot run under this Triton, when its kernels use ``tl.make_block_ptr``
    (fla until mid-2026) and this Triton no longer runs it (3.9 removed it): every call would
    raise, which is this pairing's fault, not a verdict on the kernel."""
    source = Path(kernels.__file__).read_text(encoding="utf-8", errors="replace")
    if "make_block_ptr" not in source or not triton_probes.no_block_ptr():
        return None
    return (
        f"{kernels.__name__} uses tl.make_block_ptr, which Triton {_version('triton')} does "
        "not run: use a Triton that has block pointers (docs/peers.md: which Triton for which fla)"
    )


def _prepare_interpreted(loaded: Loaded, kernels: Any) -> bool:
    """fla's kernels are interpreted; one config kept per autotuner."""
    if not triton_interpreter.is_interpreted(kernels.causal_conv1d_fwd_kernel):
        loaded.reason = (
            "fla was imported before TRITON_INTERPRET=1 was set, so its kernels are "
            "compiled-only and there is no GPU; import convmatrix's fla adapter first"
        )
        return False
    loaded.facts["autotune_configs"] = triton_interpreter.force_single_config(
        triton_interpreter.autotuners(kernels), BD=INTERPRETER_BD
    )
    return True
