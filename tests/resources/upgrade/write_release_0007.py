"""Write ``release-0007.json``: a database as the release before alerts (schema 0007, commit
25c6ca1) left it, rows and all, for tests/test_upgrade.py.

Run with that release's code, not this checkout's (its writer, scan and triage wrote the
rows; nothing here imitates them)::

    git worktree add /tmp/release-0007 25c6ca1
    cd tests/resources/upgrade
    PYTHONPATH=/tmp/release-0007:/tmp/release-0007/tests \\
        python write_release_0007.py release-0007.json

Three nightly runs of 20 synthetic cases (and three extras): run 1 good; run 2 breaks cases
0-5 and is three times slower (timing regressions of the timed cases); run 3 breaks cases
3-11 (0-2 pass again: fixed by the scan). That release kept a regression per case, kind and
output, in no alert. A person acknowledged one regression and ignored another. Every table
but alembic_version is dumped, row by row.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from reports_support import cases, synthetic_results, write_run
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from convmatrix.db import open_database
from convmatrix.db.migrate import current_revision
from convmatrix.service.regressions import list_regressions, scan_run, set_state

CASES = 20


def _fill(url: str) -> None:
    engine = open_database(url)
    ids = [c.id for c in cases(CASES)]
    runs = [(set(), 1.0), (set(ids[:6]), 3.0), (set(ids[3:12]), 1.0)]
    for n, (broken, slower) in enumerate(runs, 1):
        results = synthetic_results(
            CASES, bug=lambda c, broken=broken: c.id in broken, timed_every=4,
            timing_scale=slower,
        )  # fmt: skip
        run = write_run(engine, results, commit=str(n) * 40, label=f"nightly-{n}")
        with Session(engine) as session, session.begin():
            scan_run(session, run)
    with Session(engine) as session, session.begin():
        open_ = list_regressions(session, states=["detected"])
        set_state(session, open_[0].id, "acknowledged", by="ana", note="halo, PR 31")
        set_state(session, open_[1].id, "ignored", by="bo", note="known upstream")
    engine.dispose()


def _plain(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'old.db'}"
        _fill(url)
        engine = open_database(url)
        meta = MetaData()
        meta.reflect(engine)
        tables = {}
        with engine.connect() as conn:
            for table in meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                rows = conn.execute(select(table).order_by(*table.primary_key.columns)).all()
                tables[table.name] = {
                    "columns": [c.name for c in table.columns],
                    "rows": [[_plain(v) for v in row] for row in rows],
                }
        dump = {"revision": current_revision(engine), "release": "25c6ca1", "tables": tables}
        engine.dispose()
    Path(out).write_text(json.dumps(dump, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
