"""The database's pytest plugin (``pytest11`` entry point ``convmatrix-db``).

Under a plain ``pytest --matrix smoke --kernel torch [--db URL]`` it gives the runners'
controller a ``DatabaseStore`` (``pytest_convmatrix_store``), so a run recorded through
pytest lands in the same database as one started by ``convmatrix run``; ``--no-db`` records
nothing. ``--db`` and ``--no-db`` are run options like the others (``runners.options``).
``convmatrix run`` does not use this: the pipeline hands pytest the store it opened itself.
"""

from __future__ import annotations

import pytest

from convmatrix.db.database import Database
from convmatrix.db.run_store import DatabaseStore
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.store import MemoryStore, RunStore

_DATABASE = pytest.StashKey[Database]()


@pytest.hookimpl(optionalhook=True)
def pytest_convmatrix_store(config: pytest.Config) -> RunStore:
    options = RunOptions.from_pytest(config)
    if options.no_db:
        return MemoryStore()
    database = Database(options.db, existing=bool(options.resume))
    config.stash[_DATABASE] = database
    return DatabaseStore(database)


def pytest_unconfigure(config: pytest.Config) -> None:
    database = config.stash.get(_DATABASE, None)
    if database is not None:
        database.close()
