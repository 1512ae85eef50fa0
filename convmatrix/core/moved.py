"""Module paths earlier releases published, kept importing after the code moved.

A kernel author's plugin imports ``convmatrix.kernels.protocol`` because the release they
wrote it against documented that path; stored runs name kernels as ``module:attribute``. When
a module moves, its old name goes in ``MOVED`` (old dotted path → where it lives now) and keeps
working: importing it imports the new module, binds it under the old name too (the same module
object: ``isinstance`` and monkeypatching behave as before) and warns once with a
``DeprecationWarning`` that names the new path.

One table, no stub files: a finder on ``sys.meta_path`` (installed by ``convmatrix/__init__.py``)
answers only for the names listed here, so nothing else's import changes and no old file
lingers in the tree to be edited by mistake. ``tests/test_moved.py`` imports every entry.

The public kernel API itself has one documented path that does not move: ``convmatrix.kernels``
(``Kernel``, ``KernelBase``, ``Capabilities``, ``Geometry``, ``ContractError``, ``load``);
docs/contract.md.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MOVED", "install"]

_K = "convmatrix.kernels"
_R = "convmatrix.runners"

# old dotted path -> current dotted path (the final one: a chain of moves is collapsed here)
MOVED: dict[str, str] = {
    # kernels/ sorted by role (interface, oracle, builtin, adapters, doubles)
    f"{_K}.protocol": f"{_K}.interface.protocol",
    f"{_K}.registry": f"{_K}.interface.registry",
    f"{_K}.corecall": f"{_K}.interface.corecall",
    f"{_K}.reference": f"{_K}.oracle.reference",
    f"{_K}.scalar": f"{_K}.oracle.scalar",
    f"{_K}.selfcheck": f"{_K}.oracle.selfcheck",
    f"{_K}.semantics": f"{_K}.interface.semantics",
    f"{_K}.oracle.semantics": f"{_K}.interface.semantics",
    f"{_K}.framework": f"{_K}.builtin.framework",
    f"{_K}.planner": f"{_K}.builtin.planner",
    f"{_K}.tiled": f"{_K}.builtin.tiled",
    f"{_K}.tiled.kernel": f"{_K}.builtin.tiled.kernel",
    f"{_K}.tiled.geometry": f"{_K}.builtin.tiled.geometry",
    f"{_K}.tiled.forward": f"{_K}.builtin.tiled.forward",
    f"{_K}.tiled.backward": f"{_K}.builtin.tiled.backward",
    f"{_K}.tiled.tiles": f"{_K}.builtin.tiled.tiles",
    f"{_K}.dao": f"{_K}.adapters.dao",
    f"{_K}.fla_triton": f"{_K}.adapters.fla",
    f"{_K}.triton_interpreter": f"{_K}.adapters.triton_interpreter",
    f"{_K}.vllm": f"{_K}.adapters.vllm",
    f"{_K}.vllm_style": f"{_K}.adapters.vllm_style",
    f"{_K}.mlu_ops": f"{_K}.adapters.mlu_ops",
    f"{_K}.mlu_vllm": f"{_K}.adapters.mlu_vllm",
    f"{_K}.mlu_fla": f"{_K}.adapters.mlu_fla",
    f"{_K}.seeded": f"{_K}.doubles.seeded",
    f"{_K}.seeded.base": f"{_K}.doubles.seeded.base",
    f"{_K}.seeded.forward_bugs": f"{_K}.doubles.seeded.forward_bugs",
    f"{_K}.seeded.backward_bugs": f"{_K}.doubles.seeded.backward_bugs",
    f"{_K}.seeded.update_bugs": f"{_K}.doubles.seeded.update_bugs",
    f"{_K}.defects": f"{_K}.doubles.defects",
    f"{_K}.slowed": f"{_K}.doubles.slowed",
    f"{_K}.mlu_standin": f"{_K}.doubles.mlu_standin",
    f"{_K}.vllm_standin": f"{_K}.doubles.vllm_standin",
    # runners/ sorted by role: one case (case), one run (run), executors (executors)
    f"{_R}.inputs": f"{_R}.case.inputs",
    f"{_R}.invoke": f"{_R}.case.invoke",
    f"{_R}.execute": f"{_R}.case.execute",
    f"{_R}.metrics": f"{_R}.case.metrics",
    f"{_R}.bounds": f"{_R}.case.bounds",
    f"{_R}.chunks": f"{_R}.case.chunks",
    f"{_R}.agreement": f"{_R}.case.agreement",
    f"{_R}.properties": f"{_R}.case.properties",
    f"{_R}.applicability": f"{_R}.case.applicability",
    f"{_R}.guards": f"{_R}.case.guards",
    f"{_R}.memory": f"{_R}.case.memory",
    f"{_R}.phases": f"{_R}.case.phases",
    f"{_R}.output": f"{_R}.case.output",
    f"{_R}.defaults": f"{_R}.case.defaults",
    f"{_R}.interrupts": f"{_R}.case.interrupts",
    f"{_R}.processes": f"{_R}.case.processes",
    f"{_R}.account": f"{_R}.run.account",
    f"{_R}.controller": f"{_R}.run.controller",
    f"{_R}.store": f"{_R}.run.store",
    f"{_R}.shards": f"{_R}.run.shards",
    f"{_R}.progress": f"{_R}.run.progress",
    f"{_R}.provenance": f"{_R}.run.provenance",
    f"{_R}.threads": f"{_R}.run.threads",
    f"{_R}.placement": f"{_R}.run.placement",
    f"{_R}.workload": f"{_R}.run.workload",
    f"{_R}.plugin": f"{_R}.executors.xdist.plugin",
    f"{_R}.session": f"{_R}.executors.xdist.session",
    f"{_R}.watchdog": f"{_R}.executors.xdist.watchdog",
    f"{_R}.hooks": f"{_R}.executors.xdist.hooks",
    f"{_R}.isolated": f"{_R}.executors.isolated",
    f"{_R}.timing": f"{_R}.case.timing",
    f"{_R}.timing.calibrate": f"{_R}.case.timing.calibrate",
    f"{_R}.timing.cases": f"{_R}.case.timing.cases",
    f"{_R}.timing.measure": f"{_R}.case.timing.measure",
    f"{_R}.timing.perfmodel": f"{_R}.case.timing.perfmodel",
    f"{_R}.timing.scopes": f"{_R}.case.timing.scopes",
    f"{_R}.timing.subgraph": f"{_R}.case.timing.subgraph",
    f"{_R}.refcache": f"{_R}.case.refcache",
    f"{_R}.refcache.cache": f"{_R}.case.refcache.cache",
    f"{_R}.refcache.compact": f"{_R}.case.refcache.compact",
    f"{_R}.refcache.directory": f"{_R}.case.refcache.directory",
    f"{_R}.refcache.entry": f"{_R}.case.refcache.entry",
    f"{_R}.refcache.footprint": f"{_R}.case.refcache.footprint",
    f"{_R}.refcache.key": f"{_R}.case.refcache.key",
    # what every layer shares, gathered in core
    "convmatrix.errors": "convmatrix.core.errors",
    "convmatrix.matrix.case": "convmatrix.core.case",
    "convmatrix.matrix.tolerances": "convmatrix.core.tolerances",
    f"{_R}.verdict": "convmatrix.core.verdict",
    f"{_R}.devices": "convmatrix.core.devices",
    f"{_R}.results": "convmatrix.core.records",
    # runners: the account of a run, executors, timing
    f"{_R}.summary": f"{_R}.run.account",
    f"{_R}.plan": f"{_R}.run.workload",
    f"{_R}.engines": f"{_R}.executors",
    f"{_R}.engines.xdist": f"{_R}.executors.xdist",
    f"{_R}.engines.ray": f"{_R}.executors.ray",
    f"{_R}.perfmodel": f"{_R}.case.timing.perfmodel",
    f"{_R}.calibrate": f"{_R}.case.timing.calibrate",
    f"{_R}.timed": f"{_R}.case.timing.cases",
    f"{_R}.scopes": f"{_R}.case.timing.scopes",
    f"{_R}.subgraph": f"{_R}.case.timing.subgraph",
    # judging two runs' timings is torch-free: compare.timing
    f"{_R}.timing.compare": "convmatrix.compare.timing.pairs",
    f"{_R}.timing.history": "convmatrix.compare.timing.history",
    f"{_R}.timing.pooled": "convmatrix.compare.timing.pooled",
    f"{_R}.timing.rules": "convmatrix.compare.timing.rules",
    "convmatrix.reports.timing_compare": "convmatrix.compare.timing.pairs",
    "convmatrix.reports.timing_pooled": "convmatrix.compare.timing.pooled",
    "convmatrix.reports.timing_history": "convmatrix.compare.timing.history",
    # db
    "convmatrix.db.summaries": "convmatrix.db.aggregates",
    "convmatrix.db.store": "convmatrix.db.run_store",
}


class _Alias:
    """Loads an old name as the module that replaced it (an importlib loader; not derived from
    ``importlib.abc``, whose import every ``import convmatrix`` would pay)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        target = importlib.import_module(self.new)
        # The import system reads sys.modules back after exec_module, so the old name ends
        # up naming the real module (its own __spec__ untouched).
        sys.modules[self.old] = target
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old path will go)",
            DeprecationWarning,
            # warnings skips the import machinery's frames when stacklevel > 1: this names
            # the line that imported the old path (where the default filters show it)
            stacklevel=2,
        )


class _MovedFinder:
    """A meta-path finder answering only for the names of ``MOVED``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once (cheap: no module is imported). First,
    because an old package's submodule (``kernels.tiled.kernel``) would otherwise be found by
    the path finder inside the new package and loaded a second time under the old name."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
