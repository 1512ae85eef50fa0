"""Executors: how the cases of a prepared run reach devices and their results return.

Every executor takes a prepared run (``controller.Setup``: the checked options, what they
resolved to, and the ``RunStore`` results go to) and returns the run's ``RunAccount``;
all of them execute a case through ``convmatrix.runners.case.execute.run_case`` and record
through one ``Controller``, so the same matrix records the same results whichever executor ran
it. ("Executor", never the database engine's word: docs/architecture.md, Glossary.)

- ``xdist``: pytest-xdist on one host, one worker process per device (the ``xdist`` package:
  the executor, the pytest plugin ``plugin``, the controller's part ``session``, the plugin's
  ``hooks`` and the per-case ``watchdog``; ``-n 0`` runs the same session in this process).
- ``ray``: device actors on the nodes of a Ray cluster, the driver recording (``ray.py``,
  cases in a child process of each actor: ``isolated.py``; ray is imported only when this
  executor is chosen: ``pip install 'convmatrix[ray]'``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from convmatrix.runners.run.account import RunAccount
from convmatrix.runners.run.controller import Setup

__all__ = ["EXECUTORS", "Executor", "make_executor"]


class Executor(Protocol):
    def run(self, setup: Setup) -> RunAccount: ...


def _xdist(**options: Any) -> Executor:
    from convmatrix.runners.executors.xdist import XdistExecutor

    return XdistExecutor(**options)


def _ray(**options: Any) -> Executor:
    from convmatrix.runners.executors.ray import RayExecutor, import_ray

    import_ray()  # "unavailable: ray is not installed ..." before anything is prepared
    return RayExecutor(**options)


# Executor name -> factory; each factory imports its executor (and its dependencies) on use.
EXECUTORS: dict[str, Callable[..., Executor]] = {"xdist": _xdist, "ray": _ray}


def make_executor(name: str, **options: Any) -> Executor:
    from convmatrix.core.errors import UsageError

    if name not in EXECUTORS:
        raise UsageError(f"--executor {name!r}: choose one of {', '.join(EXECUTORS)}")
    return EXECUTORS[name](**options)
