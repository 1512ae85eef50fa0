"""Hooks the convmatrix pytest plugin adds (pluggy hookspecs, registered by ``plugin.py``).

They keep the runners beneath the database: the plugin asks for a store instead of importing
one, and announces the finished run instead of being read from outside.

- ``pytest_convmatrix_setup``: a run already prepared by its caller (``convmatrix.run``
  resolves kernel, matrix and ``--resume`` before pytest starts, for clear usage errors, and
  hands them in here so nothing is loaded twice). Under a plain ``pytest --matrix ...``
  nobody answers and the plugin prepares the run from its options.
- ``pytest_convmatrix_store``: then, the ``RunStore`` the controller records into. The
  database's plugin (``convmatrix.db.plugin``, from ``--db``) answers it; nobody answering
  means ``MemoryStore``: results are summarised, not kept.
- ``pytest_convmatrix_finished``: the run's ``RunAccount``, once, after the run is closed:
  what ``convmatrix.run`` returns and the exit status is computed from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from convmatrix.runners.run.account import RunAccount
    from convmatrix.runners.run.controller import Setup
    from convmatrix.runners.run.store import RunStore


@pytest.hookspec(firstresult=True)
def pytest_convmatrix_setup(config: pytest.Config) -> Setup | None:  # type: ignore[empty-body]
    """A run prepared by the caller of pytest (first non-None answer wins)."""


@pytest.hookspec(firstresult=True)
def pytest_convmatrix_store(config: pytest.Config) -> RunStore | None:  # type: ignore[empty-body]
    """The store of this run's results (first non-None answer wins)."""


@pytest.hookspec
def pytest_convmatrix_finished(config: pytest.Config, account: RunAccount) -> Any:
    """The run is closed; ``account`` is its final account."""
