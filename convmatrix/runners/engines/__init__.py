"""Execution engines: how the cases of a prepared run reach devices and their results return.

Every engine takes a ``RunRequest`` and a ``RunStore`` and returns the run's ``RunSummary``;
all of them execute a case through ``convmatrix.runners.execute.run_case`` and record through
one ``Controller``, so the same matrix records the same results whichever engine ran it.

- ``xdist``: pytest-xdist on one host, one worker process per device (``xdist.py``).
- ``ray``: device actors on the nodes of a Ray cluster, the driver recording (``ray.py``;
  ray is imported only when this engine is chosen: ``pip install 'convmatrix[ray]'``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from convmatrix.runners.controller import RunRequest
from convmatrix.runners.store import RunStore
from convmatrix.runners.summary import RunSummary

__all__ = ["ENGINES", "Engine", "make_engine"]


class Engine(Protocol):
    def run(self, request: RunRequest, store: RunStore) -> RunSummary: ...


def _xdist(**options: Any) -> Engine:
    from convmatrix.runners.engines.xdist import XdistEngine

    return XdistEngine(**options)


def _ray(**options: Any) -> Engine:
    from convmatrix.runners.engines.ray import RayEngine, import_ray

    import_ray()  # "unavailable: ray is not installed ..." before anything is prepared
    return RayEngine(**options)


# Engine name -> factory; each factory imports its engine (and its dependencies) on use.
ENGINES: dict[str, Callable[..., Engine]] = {"xdist": _xdist, "ray": _ray}


def make_engine(name: str, **options: Any) -> Engine:
    from convmatrix.core.errors import UsageError

    if name not in ENGINES:
        raise UsageError(f"--engine {name!r}: choose one of {', '.join(ENGINES)}")
    return ENGINES[name](**options)
