"""``convmatrix.run``: run a matrix against a kernel, record it, return its ``RunAccount``.

The Python door to the run pipeline (``convmatrix.pipeline.run``), the same run as
``convmatrix run``'s; CI scripts and notebooks call it directly::

    account = convmatrix.run("smoke", "torch", workers=0, db="sqlite:///results.db")
    assert account.passed, "\\n".join(account.lines())

Every keyword is a field of ``convmatrix.runners.options.RunOptions`` (the flags of
``convmatrix run`` without their dashes: ``device``, ``workers``, ``db``, ``no_db``, ``label``,
``commit``, ``cases``, ``resume``, ``case_timeout``, ``rule``, ``executor``, ``shard``, ...),
checked by the same function as the command line's. Bad input raises ``UsageError`` before
anything runs.
"""

from __future__ import annotations

from typing import Any

from convmatrix.core.errors import UsageError
from convmatrix.runners.run.account import RunAccount

__all__ = ["run"]


def run(matrix: str | None = None, kernel: str | None = None, **options: Any) -> RunAccount:
    """Run ``matrix`` (a built-in name or a file) against ``kernel`` (a registered name or
    ``package.module:attribute``) and record every result in ``db`` (default
    ``CONVMATRIX_DB``, else ``sqlite:///convmatrix.db``; nothing with ``no_db=True``)."""
    from convmatrix.pipeline.run import run as run_pipeline
    from convmatrix.runners.options import RunOptions

    try:
        given = RunOptions(matrix=matrix, kernel=kernel, **options)
    except TypeError as err:  # an unknown keyword
        raise UsageError(f"convmatrix.run: {err}") from None
    return run_pipeline(given).account
