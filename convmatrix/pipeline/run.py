"""A recorded run, start to end, as a sequence of named steps over one database.

    prepare -> execute -> scan -> confirm -> shrink -> report -> ci outputs

``run`` opens the database once (``db.database.Database``, lazily: a run refused while it is
prepared touches no database) and every step uses that one database engine
(``pipeline.steps``). The commands only parse and print: ``convmatrix run`` prints what the
steps left in the ``RunEnd``; ``convmatrix.run()`` returns the run's account.
"""

from __future__ import annotations

from convmatrix.db.database import Database
from convmatrix.pipeline.confirm import confirm
from convmatrix.pipeline.shrink import shrink_failures
from convmatrix.pipeline.steps import (
    RunEnd,
    Step,
    ci_outputs,
    execute,
    prepare,
    report,
    scan,
    walk,
)
from convmatrix.runners.options import RunOptions

__all__ = ["STEPS", "run"]

# The run, in order.
STEPS: tuple[tuple[str, Step], ...] = (
    ("prepare", prepare),
    ("execute", execute),
    ("scan", scan),
    ("confirm", confirm),
    ("shrink", shrink_failures),
    ("report", report),
    ("ci outputs", ci_outputs),
)


def run(options: RunOptions, database: Database | None = None) -> RunEnd:
    """Every step of one run. ``database``: an open one to record into; else the options'
    own, opened here and closed after."""
    return walk(options, database, STEPS)
