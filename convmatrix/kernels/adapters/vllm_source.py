"""vLLM's Triton causal conv1d loaded from a vLLM source tree, without importing vLLM, so that
it runs under the Triton interpreter on a machine without a GPU.

Importing ``vllm.model_executor.layers.mamba.ops.causal_conv1d`` imports vLLM's platform
detection, its config and attention packages (hundreds of modules, CUDA-only extensions), and
on a CPU the file then swaps its Triton functions for its CPU ones (``if
current_platform.is_cpu()``). The Triton kernels themselves need none of that. So the file is
executed on its own, as a private module, with the vLLM modules it imports at its top level
bridged for the duration of that one import (``sys.modules`` is left as it was):

- ``vllm.triton_utils``: Triton itself (``triton``, ``tl``), what vLLM re-exports;
- ``vllm.platforms``: a ``current_platform`` that is not a CPU (the file keeps its Triton
  functions: they are what is under test) and has no programmatic dependent launch
  (``is_arch_support_pdl()`` False, as on any GPU before Hopper); any other attribute the
  file asks for raises, naming it;
- any other ``vllm.*`` module: the names imported from it, read from that module's file in
  the same tree where it assigns them a literal (``PAD_SLOT_ID = -1``, ``NULL_BLOCK_ID = 0``
  in ``vllm/v1/attention/backends/utils.py`` of vLLM 0.33); anything else refuses to load,
  naming the import.

Where the tree is: ``CONVMATRIX_VLLM_SRC`` (a directory holding ``vllm/``), else the ``vllm``
package ``sys.path`` would import (found without importing it): a checkout on ``PYTHONPATH``,
an unpacked wheel (``pip download --no-deps vllm==X``, unzip), or an installed vllm.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["ENV", "FILE", "find_source", "load_source", "runtime_range_loops"]

ENV = "CONVMATRIX_VLLM_SRC"
FILE = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"


def find_source() -> Path | str:
    """The directory holding ``vllm/`` with the Triton conv file, or why there is none."""
    given = os.environ.get(ENV)
    if given:
        root = Path(given)
        if not (root / FILE).is_file():
            return f"{ENV}={given}: no {FILE} there"
        return root
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        root = Path(location).parent
        if (root / FILE).is_file():
            return root
    return f"no vLLM source: set {ENV} to a directory holding {FILE}, or put vLLM on PYTHONPATH"


class _InterpreterPlatform:
    """``current_platform`` as the Triton file sees it under the interpreter."""

    def is_cpu(self) -> bool:
        return False  # keep the Triton functions (the CPU ones are not under test)

    def is_arch_support_pdl(self) -> bool:
        return False  # no programmatic dependent launch: tl.extra.cuda.gdc_* never traced

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"convmatrix's vLLM platform bridge has no {name!r}")


def _literals(path: Path) -> dict[str, Any]:
    """Top-level ``NAME = <literal>`` (or ``NAME: type = <literal>``) of a Python file."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                with contextlib.suppress(ValueError):
                    found[target.id] = ast.literal_eval(value)
    return found


def _constants(root: Path, module: str, names: list[str]) -> dict[str, Any]:
    base = root / module.replace(".", "/")
    path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    literals = _literals(path) if path.is_file() else {}
    found = {name: literals[name] for name in names if name in literals}
    missing = [n for n in names if n not in found]
    if missing:
        raise ImportError(f"cannot bridge {', '.join(missing)} from {module} ({path})")
    return found


def _bridge(root: Path, module: str, names: list[str]) -> types.ModuleType:
    stub = types.ModuleType(module)
    if module == "vllm.triton_utils":
        import triton
        import triton.language as tl

        stub.__dict__.update(triton=triton, tl=tl, HAS_TRITON=True)
    elif module == "vllm.platforms":
        stub.current_platform = _InterpreterPlatform()
    else:
        stub.__dict__.update(_constants(root, module, names))
    return stub


def load_source(root: Path) -> types.ModuleType:
    """Execute ``root/FILE`` as a private module with its vLLM imports bridged."""
    path = root / FILE
    wanted: dict[str, list[str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            wanted.setdefault(node.module, []).extend(a.name for a in node.names)
    saved = {name: sys.modules.get(name) for name in wanted}
    try:
        for name, names in wanted.items():
            sys.modules[name] = _bridge(root, name, names)
        spec = importlib.util.spec_from_file_location("_convmatrix_vllm_causal_conv1d", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module


def runtime_range_loops(path: Path) -> list[int]:
    """Lines of the ``@triton.jit`` functions in ``path`` that loop ``for ... in range(n)``
    with ``n`` a runtime value (anything but literals and ``tl.constexpr`` parameters): what an
    interpreter without the ``range_tensor`` ability cannot run (``triton_probes``)."""
    lines = []
    for fn in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        if not any("jit" in ast.unparse(d) for d in fn.decorator_list):
            continue
        constexprs = {
            a.arg for a in fn.args.args if a.annotation and "constexpr" in ast.unparse(a.annotation)
        }
        for node in ast.walk(fn):
            loop = isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
            if not loop or ast.unparse(node.iter.func) != "range":
                continue
            names = {n.id for a in node.iter.args for n in ast.walk(a) if isinstance(n, ast.Name)}
            if names - constexprs:
                lines.append(node.lineno)
    return lines
