"""A database of the release before alerts, upgraded: every reading command and served page.

``resources/upgrade/release-0007.json`` holds every row that release's own code wrote (its
writer, scan and triage: three nightly runs, 58 regressions kept one per case, kind and
output, in no alert; ``write_release_0007.py`` beside it says how it was made). Here the
schema is built by running the migrations up to that release's revision 0007 (0001 to 0007
are unchanged since that release: ``git diff 25c6ca1`` shows none of them), the rows are
inserted as they were, and ``convmatrix db upgrade`` brings it to today's schema, on
SQLite and PostgreSQL. After it ``convmatrix regressions`` printed "no alerts" (``[]`` in
JSON) while 38 of those regressions were open and the served page listed them.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import DateTime, MetaData, insert, text

from convmatrix.cli import main
from convmatrix.db import make_engine
from convmatrix.db.engine import write_connection
from convmatrix.db.migrate import upgrade

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

DUMP = json.loads((Path(__file__).parent / "resources/upgrade/release-0007.json").read_text())
OLD = {name: [dict(zip(t["columns"], row, strict=True)) for row in t["rows"]]
       for name, t in DUMP["tables"].items()}  # fmt: skip
REGRESSIONS = {r["id"]: r for r in OLD["regressions"]}
OPEN = {i for i, r in REGRESSIONS.items() if r["state"] != "fixed"}


def _old_database(url: str) -> None:
    """The schema of revision 0007 through its migrations, and the release's rows in it."""
    engine = make_engine(url)
    upgrade(engine, DUMP["revision"])
    meta = MetaData()
    meta.reflect(engine)
    with write_connection(engine) as conn:
        for table in meta.sorted_tables:
            rows = OLD.get(table.name)
            if not rows:
                continue
            times = [c.name for c in table.columns if isinstance(c.type, DateTime)]
            moments = [
                {n: row[n] and datetime.fromisoformat(row[n]) for n in times} for row in rows
            ]
            conn.execute(insert(table), [row | m for row, m in zip(rows, moments, strict=True)])
            if conn.dialect.name == "postgresql" and "id" in table.columns:
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                  f"(SELECT max(id) FROM {table.name}))"))  # fmt: skip
    engine.dispose()


@pytest.fixture
def upgraded(db_url, capsys) -> str:
    _old_database(db_url)
    assert main(["db", "upgrade", "--db", db_url]) == 0
    capsys.readouterr()
    return db_url


def _cli(capsys, *args: str) -> tuple[int, str]:
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out + out.err


def test_the_fixture_is_what_the_release_left():
    assert DUMP["revision"] == "0007" and len(OLD["runs"]) == 3
    assert len(REGRESSIONS) == 58 and len(OPEN) == 38
    assert all(r["output"] for r in REGRESSIONS.values() if r["kind"] != "new_failure")


def test_the_regressions_commands_list_every_old_regression(upgraded, capsys):
    status, out = _cli(capsys, "regressions", "--format", "json", "--db", upgraded)
    assert status == 0
    alerts = json.loads(out)
    listed = [r["id"] for alert in alerts for r in alert["regressions"]]
    assert sorted(listed) == sorted(REGRESSIONS)  # each once, in the alert of its first run
    for alert in alerts:
        assert {r["first_bad_run"] for r in alert["regressions"]} == {alert["run_id"]}
        assert {r["last_good_run"] for r in alert["regressions"]} == {alert["baseline_run"]}
        for reg in alert["regressions"]:
            assert reg["state"] == REGRESSIONS[reg["id"]]["state"]
    status, out = _cli(capsys, "regressions", "--state", "detected", "--db", upgraded)
    assert status == 0 and "no alerts" not in out
    detected = {i for i, r in REGRESSIONS.items() if r["state"] == "detected"}
    assert detected <= {int(word[1:]) for word in out.split() if word[:1] == "#"}
    for alert in alerts:
        status, out = _cli(capsys, "regressions", "show", str(alert["id"]), "--db", upgraded)
        assert status == 0 and out.startswith(f"alert {alert['id']}: tiled nightly cpu, run ")
        assert all(f"#{r['id']} " in out for r in alert["regressions"])


def test_each_old_regression_shows_with_its_events(upgraded, capsys):
    events: dict[int, list[dict]] = {}
    for e in OLD["regression_events"]:
        events.setdefault(e["regression_id"], []).append(e)
    for reg_id, reg in REGRESSIONS.items():
        status, out = _cli(capsys, "regressions", "show", f"r{reg_id}", "--db", upgraded)
        assert status == 0, out
        lines = out.splitlines()
        assert lines[0].startswith(f"#{reg_id} {reg['state']}")
        shown = [line for line in lines if " -> " in line and line.startswith("  2")]
        assert [s.split(": ", 1)[1].split(" -> ")[1].split()[0].rstrip(":") for s in shown] == [
            e["to_state"] for e in events[reg_id]
        ]


def test_report_history_and_diff_read_the_old_runs(upgraded, capsys, tmp_path):
    outcomes = Counter((c["run_id"], c["outcome"]) for c in OLD["cases"])
    for run in (1, 2, 3):
        status, out = _cli(capsys, "report", str(run), "--out", str(tmp_path), "--db", upgraded)
        stored = {o: n for (r, o), n in outcomes.items() if r == run}
        assert status == (1 if stored.keys() & {"failed", "crashed"} else 0), out
        view = json.loads((tmp_path / f"run-{run}.json").read_text())
        assert view["run"]["id"] == run
        assert {o: n for o, n in view["run"]["counts"].items() if n} == stored
    status, out = _cli(capsys, "history", "--dtype", "float32", "--format", "json",
                       "--db", upgraded)  # fmt: skip
    assert status == 0
    assert sorted({p["run_id"] for p in json.loads(out)["runs"]}) == [1, 2, 3]
    new_in_2 = {r["case_id"] for r in REGRESSIONS.values()
                if r["kind"] == "new_failure" and r["first_bad_run"] == 2}  # fmt: skip
    out_file = tmp_path / "diff.html"
    status, out = _cli(capsys, "diff", "1", "2", "--out", str(out_file), "--db", upgraded)
    assert status == 0, out
    diff = json.loads(out_file.with_suffix(".json").read_text())
    assert {c["case_id"] for c in diff["new_failures"]} == new_in_2


def test_the_served_pages_of_the_old_database(upgraded):
    with TestClient(create_app(upgraded)) as client:
        index = client.get("/api/regressions").json()
        assert index["unfiled"] == []
        listed = [r["id"] for alert in index["alerts"] for r in alert["regressions"]]
        assert sorted(listed) == sorted(REGRESSIONS)
        assert client.get("/regressions").status_code == 200
        for alert in index["alerts"]:
            for path in (f"/alerts/{alert['id']}", f"/api/alerts/{alert['id']}"):
                assert client.get(path).status_code == 200, path
        for reg_id in REGRESSIONS:
            page = client.get(f"/api/regressions/{reg_id}").json()["regression"]
            assert page["state"] == REGRESSIONS[reg_id]["state"]
            assert client.get(f"/regressions/{reg_id}").status_code == 200
        for path in ("/", "/runs/1", "/runs/3", "/diff/1/2", "/history/float32",
                     f"/cases/{REGRESSIONS[min(OPEN)]['case_id']}"):  # fmt: skip
            assert client.get(path).status_code == 200, path


def test_a_run_passing_the_old_cases_closes_every_old_regression_of_them(upgraded):
    """The release kept one regression per output, so a (case, kind) can hold several open
    rows; a later run that passes the case closes all of them, not only the newest (before,
    18 of the 38 stayed open for good)."""
    from reports_support import write_run
    from sqlalchemy import select

    from convmatrix.db.database import Database
    from convmatrix.db.models import RegressionRow
    from convmatrix.db.queries import load_results
    from convmatrix.service.scan import scan_run

    with Database(upgraded, existing=True) as database:
        with database.reading() as conn:
            first = load_results(conn, 1)  # the release's first run: what passed before
        run = write_run(database.engine, first, commit="4" * 40)
        with database.writing() as session:
            scan_run(session, run)
        with database.reading() as conn:
            outcome = {r.case.id: r.outcome for r in load_results(conn, run)}
        with database.session() as session:
            still = [r for r in session.scalars(select(RegressionRow)) if r.state != "fixed"]
    closable = [r for r in REGRESSIONS.values()
                if r["state"] != "fixed" and outcome.get(r["case_id"]) == "passed"]  # fmt: skip
    assert closable  # the fixture holds open regressions of cases run 1 passed
    assert all(outcome.get(r.case_id) != "passed" for r in still), [
        (r.id, r.case_id, r.kind, r.state) for r in still if outcome.get(r.case_id) == "passed"
    ]
