"""Roles inside a layer: ``kernels/`` and ``runners/`` are each sorted into role subpackages,
and a role imports only the roles below it.

tests/test_layering.py orders the layers of the package; this orders the roles within two of
them, read from the same import graph (every import, lazy and ``TYPE_CHECKING`` ones too).

- kernels: ``interface`` (the API, the semantics' contracts, the registry) < ``oracle`` (the
  float64 reference) < ``builtin`` < ``adapters`` (real libraries) < ``doubles`` (kernels wrong on
  purpose, stand-ins of libraries and the adapters over them).
- runners: ``case`` (one case, run and judged) < ``run`` (one run: the controller, what it
  records into, ``runners.options``, which stays at the top of the package) < ``executors``
  (how a run's cases reach devices: xdist with its pytest plugin, Ray).

The case reaches the oracle through one module: ``runners.case.reference`` asks
``kernels.oracle.steps`` for a case's reference, and no runner imports another oracle module.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_layering import GRAPH, MODULES

ROLES = {
    "convmatrix.kernels": ("interface", "oracle", "builtin", "adapters", "doubles"),
    "convmatrix.runners": ("case", "run", "executors"),
}
# Modules of a layer kept outside its role folders, and the role they belong to.
PLACED = {"convmatrix.runners.options": "run"}
ORACLE = "convmatrix.kernels.oracle"
ORACLE_DOOR = "convmatrix.kernels.oracle.steps"
RUN_CASE = "convmatrix.runners.case.execute"


def role_of(module: str, layer: str) -> int | None:
    """The index of ``module``'s role in ``layer`` (None: the layer's own ``__init__``)."""
    parts = module[len(layer) + 1 :].split(".") if module.startswith(layer + ".") else []
    if module in PLACED and parts:
        return ROLES[layer].index(PLACED[module])
    return ROLES[layer].index(parts[0]) if parts and parts[0] in ROLES[layer] else None


@pytest.mark.parametrize("layer", sorted(ROLES))
def test_every_module_of_the_layer_has_a_role(layer: str) -> None:
    loose = [m for m in MODULES if m.startswith(layer + ".") and role_of(m, layer) is None]
    assert not loose, f"modules of {layer} in no role: {loose}"


@pytest.mark.parametrize("layer", sorted(ROLES))
def test_every_role_imports_only_the_roles_below_it(layer: str) -> None:
    roles = ROLES[layer]
    upward = []
    for source, targets in GRAPH.items():
        below = role_of(source, layer)
        if below is None:
            continue
        for target in targets:
            above = role_of(target, layer)
            if above is not None and above > below:
                upward.append(f"{source} ({roles[below]}) imports {target} ({roles[above]})")
    assert not upward, "imports pointing up a role:\n" + "\n".join(sorted(upward))


def test_the_role_check_sees_an_upward_import() -> None:
    layer = "convmatrix.kernels"
    assert role_of("convmatrix.kernels.interface.registry", layer) == 0
    assert role_of("convmatrix.kernels.doubles.seeded.base", layer) == 4
    assert role_of("convmatrix.kernels", layer) is None
    assert role_of("convmatrix.runners.options", "convmatrix.runners") == 1


def _oracle_imports(module: str) -> set[str]:
    return {t for t in GRAPH[module] if t == ORACLE or t.startswith(ORACLE + ".")}


def test_the_runners_enter_the_oracle_through_one_module() -> None:
    entered = {
        target
        for module in MODULES
        if module.startswith("convmatrix.runners.")
        for target in _oracle_imports(module)
    }
    assert entered == {ORACLE_DOOR}, sorted(entered)


def test_run_case_s_module_reaches_the_oracle_through_one_module() -> None:
    """``run_case`` imports no oracle module itself; exactly one of the modules it imports
    computes the case's reference (``runners.case.reference``), and every oracle module the
    case's code reaches is reached through ``kernels.oracle.steps``."""
    assert not _oracle_imports(RUN_CASE)
    doors = [m for m in GRAPH[RUN_CASE] if m in MODULES and ORACLE_DOOR in GRAPH[m]]
    assert doors == ["convmatrix.runners.case.reference"], doors


def test_a_seeded_kernel_loads_by_its_prefix_in_a_fresh_process() -> None:
    """The registry imports no double: ``seeded:NAME`` is found through the family table
    (``registry.FAMILY_GROUP``), and the family's module is imported only when asked for."""
    code = (
        "import sys\n"
        "from convmatrix.kernels.interface.registry import load\n"
        "assert 'convmatrix.kernels.doubles.seeded' not in sys.modules\n"
        "kernel = load('seeded:taps_reversed')\n"
        "print(type(kernel).__module__, kernel.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("convmatrix.kernels.doubles.seeded."), done.stdout
