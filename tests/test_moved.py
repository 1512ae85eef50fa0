"""Module paths of earlier releases keep importing, with a warning that names the new path
(``convmatrix.core.moved``)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from convmatrix.core.moved import MOVED


def _forget(name: str) -> None:
    """Drop ``name`` (and its submodules) from the import cache, so the import runs again."""
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if key in MOVED:
            del sys.modules[key]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_path_imports_as_the_module_it_became(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    _forget(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new  # one module object: isinstance and monkeypatching hold across names
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(MOVED[old] in text and old in text for text in said), said


def test_every_target_is_a_module_of_today() -> None:
    """A move whose target moved again must be rewritten to the final path (no chains)."""
    assert not set(MOVED.values()) & set(MOVED)


def test_a_plugin_written_against_the_previous_release_still_loads() -> None:
    """The import the previous release documented for kernel authors, in a fresh process with
    Python's default warning filters: it works and the author is told where to go."""
    code = (
        "from convmatrix.kernels.protocol import KernelBase\n"
        "import convmatrix.kernels\n"
        "assert KernelBase is convmatrix.kernels.KernelBase\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning: convmatrix.kernels.protocol moved to" in done.stderr
    assert "convmatrix.kernels.interface.protocol" in done.stderr


def test_an_old_package_s_submodule_is_not_loaded_twice() -> None:
    _forget("convmatrix.kernels.tiled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("convmatrix.kernels.tiled.kernel")
    assert old is importlib.import_module("convmatrix.kernels.builtin.tiled.kernel")


def test_a_stored_kernel_spec_with_an_old_module_path_still_loads() -> None:
    """Runs record ``module:attribute`` specs; one recorded before a move names the old path."""
    from convmatrix.kernels import load

    _forget("convmatrix.kernels.tiled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        kernel = load("convmatrix.kernels.tiled:TiledKernel")
    assert type(kernel).__module__ == "convmatrix.kernels.builtin.tiled.kernel"
