"""Pages of finished runs, stored once and served from there (``reports.stored``, ``db.pages``).

A finished run's page is built once, then read back without touching its results; it is the
same page a fresh build gives; it is built afresh when what it shows changes (triage of a
regression it links, a resumed run gaining results); a run still being written is never
stored. One case's page reads that one case. The served app answers in parallel, and eight
clients asking for a cold page at once all get the same page. On SQLite and
PostgreSQL (``db_url``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from reports_support import cases, synthetic_results, write_run
from sqlalchemy import Engine, delete, event, func, select
from sqlalchemy.orm import Session
from test_serve import running_server

from convmatrix.cli import main
from convmatrix.core.records import RunMeta
from convmatrix.db import ResultWriter, open_database
from convmatrix.db.engine import write_session
from convmatrix.db.models import RunPageRow
from convmatrix.service.scan import scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

TOKEN = "stored-pages-token"
BROKEN = {c.id for c in cases(40)[:2]}


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process sends meanwhile."""
    sent: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def _reads(sent: list[str], table: str) -> list[str]:
    return [s for s in sent if re.search(rf"\bFROM {table}\b", s)]


def _stored(url: str, run_id: int) -> dict[str, str]:
    engine = open_database(url)
    try:
        with Session(engine) as session:
            rows = session.execute(
                select(RunPageRow.name, RunPageRow.stamp).where(RunPageRow.run_id == run_id)
            )
            return dict(rows.all())
    finally:
        engine.dispose()


def _forget(url: str) -> None:
    """Drop every stored page: the next request builds afresh."""
    engine = open_database(url)
    with write_session(engine) as session:
        session.execute(delete(RunPageRow))
    engine.dispose()


def _two_runs(url: str, n: int = 40) -> tuple[int, int]:
    """A good run and a broken one, scanned: the broken run's page links two regressions."""
    engine = open_database(url)
    good = write_run(engine, synthetic_results(n, timed_every=3), commit="1" * 40)
    bug = lambda c: c.id in BROKEN  # noqa: E731
    broken = write_run(engine, synthetic_results(n, bug=bug, timed_every=3), commit="2" * 40)
    with write_session(engine) as session:
        scan_run(session, broken)
    engine.dispose()
    return good, broken


def test_a_finished_runs_page_is_built_once_then_read_without_its_results(db_url):
    _, run = _two_runs(db_url)
    with TestClient(create_app(db_url)) as client:
        with statements() as first:
            html = client.get(f"/runs/{run}").text
            data = client.get(f"/api/runs/{run}").text
        assert _reads(first, "metrics") and _reads(first, "timings")  # built from the results
        with statements() as again:
            assert client.get(f"/runs/{run}").text == html
            assert client.get(f"/api/runs/{run}").text == data
        assert not _reads(again, "metrics") and not _reads(again, "timings")
        assert set(_stored(db_url, run)) == {f"served /runs/{run}", "run.json"}
        # What was stored is what a fresh build gives.
        _forget(db_url)
        assert client.get(f"/runs/{run}").text == html
        assert client.get(f"/api/runs/{run}").text == data
    view = json.loads(data)
    assert {f["case_id"] for f in view["failures"]} >= BROKEN


def test_the_report_command_writes_the_stored_report(db_url, tmp_path, capsys):
    _, run = _two_runs(db_url)
    args = ["report", str(run), "--db", db_url, "--out"]
    assert main([*args, str(tmp_path / "first")]) == 1
    printed = capsys.readouterr().out
    with statements() as sent:
        assert main([*args, str(tmp_path / "again")]) == 1
    assert not _reads(sent, "metrics")
    first, again = str(tmp_path / "first"), str(tmp_path / "again")
    assert capsys.readouterr().out == printed.replace(first, again)
    for name in (f"run-{run}.html", f"run-{run}.json"):
        assert (tmp_path / "again" / name).read_text() == (tmp_path / "first" / name).read_text()
    _forget(db_url)  # a fresh build writes the same files
    assert main([*args, str(tmp_path / "fresh")]) == 1
    for name in (f"run-{run}.html", f"run-{run}.json"):
        assert (tmp_path / "fresh" / name).read_text() == (tmp_path / "first" / name).read_text()


def _regression_links(html: str) -> set[str]:
    return set(re.findall(r"regression #\d+ \(new failure, (\w+)\)", html))


def test_triage_of_a_regression_the_page_links_builds_it_afresh(db_url):
    _, run = _two_runs(db_url)
    with TestClient(create_app(db_url, token=TOKEN)) as client:
        before = client.get(f"/runs/{run}").text
        assert _regression_links(before) == {"detected"}
        stamp = _stored(db_url, run)[f"served writable /runs/{run}"]
        alert = client.get("/api/regressions").json()["alerts"][0]
        reg = alert["regressions"][0]["id"]
        answer = client.post(
            f"/api/regressions/{reg}", content=json.dumps({"state": "acknowledged"}),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        assert answer.status_code == 200
        after = client.get(f"/runs/{run}").text
        assert _regression_links(after) == {"detected", "acknowledged"}
        assert f'data-regression-id="{reg}">regression #{reg} (new failure, acknowledged)' in after
        assert _stored(db_url, run)[f"served writable /runs/{run}"] != stamp
        _forget(db_url)
        assert client.get(f"/runs/{run}").text == after


def test_a_run_being_written_stays_live_and_a_resumed_one_is_built_afresh(db_url):
    engine = open_database(db_url)
    results = synthetic_results(30, extras=False)
    with ResultWriter(engine, batch_size=1000) as writer, TestClient(create_app(db_url)) as client:
        run = writer.start_run(RunMeta(kernel="tiled", matrix="nightly", matrix_hash="f" * 64))

        def shown() -> int:
            return client.get(f"/api/runs/{run}").json()["run"]["n_cases"]

        for r in results[:10]:
            writer.add(r)
        writer.flush()
        assert shown() == 10 and client.get(f"/runs/{run}").status_code == 200
        for r in results[10:20]:
            writer.add(r)
        writer.flush()
        assert shown() == 20  # live: every request reads the results
        assert _stored(db_url, run) == {}  # and nothing of a running run is kept
        writer.finish_run()
        assert shown() == 20 and "run.json" in _stored(db_url, run)
        writer.resume_run(run)  # convmatrix run --resume: running again
        for r in results[20:]:
            writer.add(r)
        writer.flush()
        assert shown() == 30
        writer.finish_run()
        assert shown() == 30
    engine.dispose()


def test_one_cases_page_reads_that_case_of_the_newest_run(db_url):
    good, broken = _two_runs(db_url)
    case = next(c for c in cases(40) if c.id in BROKEN)
    with TestClient(create_app(db_url)) as client:
        with statements() as sent:
            page = client.get(f"/api/cases/{case.id[:10]}").json()
        assert client.get(f"/cases/{case.id}").status_code == 200
    assert page["case_id"] == case.id and page["name"] == case.pytest_id
    assert page["params"] == {k: v for k, v in case.to_json().items() if v is not None}
    assert [(r["run_id"], r["outcome"]) for r in page["runs"]] == [
        (good, "passed"), (broken, "failed"),
    ]  # fmt: skip
    # Not the whole run: no property or timing row is read, no case row but this case's.
    assert not _reads(sent, "properties") and not _reads(sent, "timings")
    assert all("case_id" in s for s in _reads(sent, "cases"))


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.status, response.read()


def test_eight_clients_at_once_get_the_same_page_and_the_server_answers_in_parallel(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = open_database(url)
    small = write_run(engine, synthetic_results(20), commit="1" * 40)
    # Big enough that building its page outlasts the pause below with room to spare: 0.9 s
    # on a quiet machine (3000 cases took 0.6 s before reading a run got faster, a margin of
    # 0.1 s over the old 0.5 s pause: a quiet machine could finish the build first).
    big = write_run(engine, synthetic_results(6000, timed_every=5), commit="2" * 40)
    engine.dispose()
    with running_server(url) as base:
        answers: dict[str, tuple[int, bytes]] = {}
        order: list[str] = []

        def fetch(name: str, path: str) -> None:
            answers[name] = _get(base + path)
            order.append(name)

        slow = [threading.Thread(target=fetch, args=(f"big{i}", f"/runs/{big}")) for i in range(8)]
        for thread in slow:
            thread.start()
        time.sleep(0.2)  # the eight are in flight: their page takes 0.9 s or more to build
        fetch("small", f"/api/runs/{small}")
        for thread in slow:
            thread.join()
        bodies = {answers[f"big{i}"] for i in range(8)}
        assert len(bodies) == 1 and {s for s, _ in bodies} == {200}
        # A cheap page is not queued behind eight builds of an expensive one.
        assert order[0] == "small"
        assert _get(base + f"/runs/{big}") == bodies.pop()
    engine = open_database(url)
    with Session(engine) as session:
        kept = session.scalar(select(func.count()).where(RunPageRow.run_id == big))
    engine.dispose()
    assert kept == 1  # stored, for the next reader


def test_a_sharded_run_is_stored_only_once_every_shard_reported(db_url):
    engine = open_database(db_url)
    results = synthetic_results(20, extras=False)
    meta = RunMeta(kernel="tiled", matrix="nightly", matrix_hash="f" * 64)
    with TestClient(create_app(db_url)) as client:
        for shard in (0, 1):
            with ResultWriter(engine) as writer:
                run = writer.join_sharded_run(meta, "ci-7", 2, shard)
                for r in results[shard::2]:
                    writer.add(r)
                writer.flush()
                writer.finish_shard(shard, "finished")
            view = client.get(f"/api/runs/{run}").json()["run"]
            assert view["n_cases"] == 10 * (shard + 1)
            assert view["shards_missing"] == ([] if shard else ["1/2 never started"])
            assert ("run.json" in _stored(db_url, run)) == (shard == 1)
    engine.dispose()
