"""The database's pytest plugin (``pytest11`` entry point ``convmatrix-db``).

Under a plain ``pytest --matrix smoke --kernel torch [--db URL]`` it gives the runners'
controller a ``DatabaseStore`` (``pytest_convmatrix_store``), so a run recorded through
pytest lands in the same database as one started by ``convmatrix run``; ``--no-db`` records
nothing. ``convmatrix run`` does not load it: it hands pytest the store it opened itself.
"""

from __future__ import annotations

import pytest

from convmatrix.db.run_store import DatabaseStore
from convmatrix.runners.store import MemoryStore, RunStore


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("convmatrix", "convmatrix: run a kernel test matrix")
    group.addoption("--db", help="results database URL (default CONVMATRIX_DB or sqlite)")
    group.addoption("--no-db", action="store_true", help="record nothing (summary only)")


@pytest.hookimpl(optionalhook=True)
def pytest_convmatrix_store(config: pytest.Config) -> RunStore:
    if config.getoption("no_db"):
        return MemoryStore()
    return DatabaseStore(config.getoption("db"))
