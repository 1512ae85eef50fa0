"""Two runs writing to one database at once lose nothing (SQLite file and PostgreSQL).

Two real processes start together on a fresh database (so they also race to create the
schema), each writes its own run in many small batches, interleaved with the other's.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from db_fixtures import fake_result
from sqlalchemy import func, select

from convmatrix.db import Session, load_results, open_database, resolve_run
from convmatrix.db.engine import make_engine
from convmatrix.db.models import MetricRow

N = 150  # results per process; with batches of 7 that is 22 transactions each
_WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from db_fixtures import fake_meta, fake_result
from convmatrix.db import ResultWriter, open_database

go = Path({go!r})
(go.parent / {label!r}).touch()  # imported and ready
while not go.exists():
    time.sleep(0.005)
engine = open_database({url!r})
with ResultWriter(engine, batch_size=7) as writer:
    writer.start_run(fake_meta(label={label!r}))
    for i in range({n}):
        writer.add(fake_result(i))
"""


def _spawn(url: str, go: Path, label: str) -> subprocess.Popen:
    tests = str(Path(__file__).parent)
    script = _WRITER.format(tests=tests, go=str(go), url=url, label=label, n=N)
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)


def test_two_processes_writing_at_once_lose_nothing(db_url, tmp_path):
    go = tmp_path / "go"
    procs = [_spawn(db_url, go, label) for label in ("first", "second")]
    deadline = time.monotonic() + 120
    while not all((tmp_path / label).exists() for label in ("first", "second")):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break  # a writer died: its stderr is reported below
        time.sleep(0.01)
    go.touch()  # both are polling: they start together
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    engine = open_database(db_url)
    expected_ids = [fake_result(i).case.id for i in range(N)]
    with Session(engine) as session:
        for label in ("first", "second"):
            run = resolve_run(session, label)
            assert run.status == "finished" and run.counts["passed"] == N
            assert [r.case.id for r in load_results(session, run.id)] == expected_ids
        metrics = session.scalar(select(func.count()).select_from(MetricRow))
    assert metrics == 2 * N * 2  # two outputs per result, two runs
    engine.dispose()


def test_opening_a_new_file_waits_while_another_connection_creates_its_schema(tmp_path):
    """The WAL switch is not covered by SQLite's busy handler: on a file still in rollback
    mode whose write lock another connection holds, it fails at once unless retried."""
    path = tmp_path / "new.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the first run, creating its schema
    other.execute("CREATE TABLE first_run (x)")
    held_s = 0.5
    release = threading.Timer(held_s, lambda: other.execute("COMMIT"))
    started = time.monotonic()
    release.start()
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        waited = time.monotonic() - started
    finally:
        release.join()
        engine.dispose()
        other.close()
    assert mode == "wal"
    assert waited >= held_s  # it connected only once the lock was gone, not around it
