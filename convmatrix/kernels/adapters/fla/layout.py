"""Where fla keeps its Triton causal conv1d, found by looking, never by a version string.

fla moved its conv three times (read in its PyPI releases, each a tree like a source checkout):

| layout | releases | functions (fla.modules.) | Triton kernels |
|---|---|---|---|
| ``causal_conv1d/`` | fla-core 0.6.0 | ``causal_conv1d`` | ``causal_conv1d.ops`` |
| ``conv/`` | fla-core 0.4.2-0.5.2 | ``conv.causal_conv1d``, ``.triton`` | ``conv.triton.kernels`` |
| ``convolution.py`` | 0.2.2-0.4.1 (flash-linear-attention) | ``convolution`` | the same |

0.4.2-0.5.2 keep ``convolution.py`` as a shim over ``conv/``, so the layouts are tried newest
first, by the files present in the fla package found on ``sys.path`` (without importing it).
flash-linear-attention 0.1-0.2.1 have a ``convolution.py`` without a Triton conv (their
``ShortConvolution`` calls Dao's ``causal_conv1d`` package): no ``causal_conv1d`` attribute
there, and the adapter says so.

Importing: fla's package ``__init__`` files import every layer and model (``transformers``)
and every op's kernels; under one Triton or another some kernel unrelated to the conv fails
to decorate (fla-core 0.4.2-0.5.2 under Triton 3.9: ``ValueError: key contains names that
are not kernel arguments``, in a context-parallel op). None of that is a verdict on the conv,
so ``import_conv`` registers ``fla``, ``fla.modules`` and ``fla.ops`` as bare packages (their
``__path__`` only, ``fla.__version__`` read from the tree) and imports the conv modules with
what they import themselves. A package already imported is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LAYOUTS", "Api", "FlaLayout", "find_layout", "fla_roots", "import_conv", "probe_api"]


@dataclass(frozen=True)
class FlaLayout:
    """One place fla kept its conv: the file that marks it and the modules to import."""

    name: str
    marker: str  # relative to the fla package directory
    functions: str  # the module with causal_conv1d
    update: str  # the module with causal_conv1d_update
    kernels: str  # the module defining the @triton.jit kernels (autotuners live there)


LAYOUTS = (
    FlaLayout(
        "causal_conv1d/",
        "modules/causal_conv1d/__init__.py",
        "fla.modules.causal_conv1d",
        "fla.modules.causal_conv1d",
        "fla.modules.causal_conv1d.ops",
    ),
    FlaLayout(
        "conv/",
        "modules/conv/triton/kernels.py",
        "fla.modules.conv.causal_conv1d",
        "fla.modules.conv.triton",
        "fla.modules.conv.triton.kernels",
    ),
    FlaLayout(
        "convolution.py",
        "modules/convolution.py",
        "fla.modules.convolution",
        "fla.modules.convolution",
        "fla.modules.convolution",
    ),
)

_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def fla_roots() -> list[Path]:
    """The directories of the ``fla`` package that an import would use, without importing it
    (several when fla is a namespace spread over fla-core and flash-linear-attention)."""
    module = sys.modules.get("fla")
    if module is not None:
        return [Path(p) for p in getattr(module, "__path__", [])]
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def find_layout(roots: list[Path]) -> FlaLayout | None:
    """The newest layout whose marker file one of ``roots`` has."""
    for layout in LAYOUTS:
        if any((root / layout.marker).is_file() for root in roots):
            return layout
    return None


def tree_version(roots: list[Path]) -> str | None:
    """``__version__`` as written in the tree's ``fla/__init__.py`` (recorded, never used to
    choose anything: a checkout between releases carries the last release's string)."""
    for root in roots:
        init = root / "__init__.py"
        if init.is_file():
            found = _VERSION.search(init.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(1)
    return None


def _bare_package(name: str, roots: list[Path], relative: str, version: str | None) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    dirs = [root / relative if relative else root for root in roots]
    module.__file__ = str(dirs[0] / "__init__.py")  # the run's provenance reads the file
    # a spec, so that importlib.util.find_spec(name) answers from sys.modules as for any
    # imported package (without one it raises ValueError)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [str(d) for d in dirs if d.is_dir()]
    module.__path__ = module.__spec__.submodule_search_locations
    module.__package__ = name
    if version is not None:
        module.__version__ = version  # fla.utils of 0.5.2+ imports it
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    sys.modules[name] = module


def import_conv(layout: FlaLayout, roots: list[Path]) -> tuple[Any, Any, Any]:
    """(functions module, update module, kernels module) of ``layout``, the package
    ``__init__`` files of fla, fla.modules and fla.ops skipped (module docstring)."""
    version = tree_version(roots)
    for name, relative in (("fla", ""), ("fla.modules", "modules"), ("fla.ops", "ops")):
        _bare_package(name, roots, relative, version)
    functions = importlib.import_module(layout.functions)
    update = importlib.import_module(layout.update)
    kernels = importlib.import_module(layout.kernels)
    return functions, update, kernels


@dataclass(frozen=True)
class Api:
    """What the loaded ``causal_conv1d`` takes, read from its signature."""

    states: bool  # initial_state / output_final_state (flash-linear-attention >= 0.3.1)
    chunk_size: int | None  # causal_conv1d_fwd's fixed time tile, when it has one

    @property
    def tile_rule(self) -> str:
        if self.chunk_size is not None:
            return f"chunk_size {self.chunk_size} (causal_conv1d_fwd's default)"
        return "BT = min(64, next_power_of_2(cdiv(max(16, B*T), SM count)))"


def probe_api(modules: tuple[Any, Any, Any]) -> Api | str:
    """The API of the loaded conv (``import_conv``'s modules), or why it has none this
    adapter can call."""
    functions, _, kernels = modules
    conv = getattr(functions, "causal_conv1d", None)
    if conv is None or not hasattr(kernels, "causal_conv1d_fwd_kernel"):
        return (
            f"{functions.__name__} has no Triton causal_conv1d (fla before 0.2.2: its "
            "ShortConvolution calls Dao's causal_conv1d package)"
        )
    params = inspect.signature(conv).parameters
    fwd = next(m.causal_conv1d_fwd for m in modules if hasattr(m, "causal_conv1d_fwd"))
    fwd_params = inspect.signature(fwd).parameters
    tile = next((fwd_params[n].default for n in ("chunk_size", "BT") if n in fwd_params), None)
    chunk = tile if isinstance(tile, int) else None
    return Api(states="initial_state" in params, chunk_size=chunk)
