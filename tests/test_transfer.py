"""``export``/``import``: runs moved as JSON lines between real databases (SQLite into
PostgreSQL too) come back result for result, NaN included, keep their times, and are scanned."""

from __future__ import annotations

import json
import math
import os

import pytest
from reports_support import cases, synthetic_results, write_run
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.db import load_results, open_database, resolve_run
from convmatrix.db.engine import write_session
from convmatrix.db.models import AlertRow, RegressionEventRow, RegressionRow, Run
from convmatrix.db.queries import list_runs
from convmatrix.service.regressions import list_regressions, regression_events, triage
from convmatrix.service.scan import scan_run

BROKEN = {c.id for c in cases(30)[:2]}


def _results_equal(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.case == y.case and x.outcome == y.outcome and x.message == y.message
        for m, n in zip(x.outputs, y.outputs, strict=True):
            for f in ("e_abs", "e_rel", "e_norm"):
                u, v = getattr(m, f), getattr(n, f)
                assert (math.isnan(u) and math.isnan(v)) or u == v  # exactly: repr round-trips
        assert [t.samples for t in x.timings] == [t.samples for t in y.timings]


@pytest.mark.parametrize("target", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_runs_move_between_databases_as_json_lines(target, tmp_path, request, capsys):
    source = f"sqlite:///{tmp_path / 'device-host.db'}"
    engine = open_database(source)
    results = synthetic_results(30, timed_every=3)
    results[0].outputs[0].e_rel = math.nan  # a NaN must survive the trip
    write_run(engine, results, commit="1" * 40, label="host-a")
    bad = synthetic_results(30, bug=lambda c: c.id in BROKEN)
    write_run(engine, bad, commit="2" * 40)
    engine.dispose()
    dump = tmp_path / "runs.jsonl"
    assert main(["export", "--all", "--out", str(dump), "--db", source]) == 0
    assert len(dump.read_text().splitlines()) == 2 + len(results) + len(bad)
    target_url = request.getfixturevalue(f"{target}_url")
    if target == "sqlite":
        target_url = f"sqlite:///{tmp_path / 'central.db'}"
    assert main(["import", str(dump), "--db", target_url]) == 0
    assert "run 2: " in capsys.readouterr().out
    a, b = open_database(source), open_database(target_url)
    with Session(a) as sa, Session(b) as sb:
        for spec in ("1", "2"):
            old, new = resolve_run(sa, spec), resolve_run(sb, spec)
            assert (new.label, new.kernel_commit, new.status) == (
                old.label, old.kernel_commit, old.status)  # fmt: skip
            assert new.started_at == old.started_at and new.counts == old.counts
            _results_equal(load_results(sa, old.id), load_results(sb, new.id))
        found = list_regressions(sb)
    # Scanned on import: run 2's new failures are the broken cases; run 1, older than run 2,
    # takes its place in history and raises nothing (by time order, not file order).
    second = {r.case_id for r in found if r.kind == "new_failure" and r.first_bad_run == 2}
    assert second == BROKEN
    assert {r.first_bad_run for r in found} == {2}
    a.dispose()
    b.dispose()


def _counts(url: str) -> tuple[int, int, int, int]:
    engine = open_database(url)
    with Session(engine) as session:
        counted = tuple(
            session.scalar(select(func.count()).select_from(table))
            for table in (Run, RegressionRow, RegressionEventRow, AlertRow)
        )
    engine.dispose()
    return counted  # type: ignore[return-value]


def test_importing_the_same_export_twice_changes_nothing_and_triage_travels(tmp_path, capsys):
    source = f"sqlite:///{tmp_path / 'a.db'}"
    engine = open_database(source)
    write_run(engine, synthetic_results(30), commit="1" * 40)
    bad = write_run(engine, synthetic_results(30, bug=lambda c: c.id in BROKEN), commit="2" * 40)
    with write_session(engine) as session:
        scan = scan_run(session, bad)
        reg = scan.new[0].id
        triage(session, reg, by="ana", state="acknowledged", note="PR 12", assignee="bo")
    engine.dispose()
    dump = tmp_path / "runs.jsonl"
    assert main(["export", "--all", "--out", str(dump), "--db", source]) == 0
    target = f"sqlite:///{tmp_path / 'b.db'}"
    assert main(["import", str(dump), "--db", target]) == 0
    after_one = _counts(target)
    assert after_one == _counts(source)  # runs, regressions, events and alerts, as they were
    assert main(["import", str(dump), "--db", target]) == 0
    assert "import: runs none" in capsys.readouterr().out
    assert _counts(target) == after_one  # the second time: nothing
    engine = open_database(target)
    with Session(engine) as session:
        moved = next(r for r in list_regressions(session) if r.case_name == scan.new[0].case_name
                     and r.kind == scan.new[0].kind)  # fmt: skip
        events = regression_events(session, moved.id)
        uids = {r.uid for r in list_runs(session, kinds=None)}
    assert (moved.state, moved.assignee, moved.note) == ("acknowledged", "bo", "PR 12")
    first_two = [(e.by, e.to_state) for e in events][:2]
    assert first_two == [("scan", "detected"), ("ana", "acknowledged")]
    source_engine = open_database(source)
    with Session(source_engine) as session:
        assert uids == {r.uid for r in list_runs(session, kinds=None)}  # the runs' identities
    source_engine.dispose()
    engine.dispose()


def test_a_bad_line_names_the_file_and_line(tmp_path, capsys):
    dump = tmp_path / "bad.jsonl"
    dump.write_text('{"kind": "run", "id": 1, "meta": {"kernel": "k"}, "started_at": "x"}\n')
    assert main(["import", str(dump), "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert f"{dump}:1: bad run line" in capsys.readouterr().err
    dump.write_text('{"kind": "result", "run": 7, "result": {}}\n')
    assert main(["import", str(dump), "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert f"{dump}:1: a result before its run line" in capsys.readouterr().err
    dump.write_text("not json\n")
    assert main(["import", str(dump), "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert f"{dump}:1: not JSON" in capsys.readouterr().err
    # every file is validated before the database is opened: a refused import creates none
    assert not os.path.exists(tmp_path / "x.db")


# -- a run imported again, and lines that are wrong ------------------------------------------


def _export(url: str, out) -> list[dict]:
    assert main(["export", "--all", "--out", str(out), "--db", url]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _write_lines(path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _two_runs(tmp_path) -> str:
    """Run 1 good, run 2 breaking BROKEN, in a database of their own."""
    source = f"sqlite:///{tmp_path / 'source.db'}"
    engine = open_database(source)
    write_run(engine, synthetic_results(30), commit="1" * 40)
    write_run(engine, synthetic_results(30, bug=lambda c: c.id in BROKEN), commit="2" * 40)
    engine.dispose()
    return source


def _stored(url: str, run: str) -> tuple[str, int, set[str]]:
    engine = open_database(url)
    with Session(engine) as session:
        info = resolve_run(session, run)
        ids = {r.case.id for r in load_results(session, info.id)}
    engine.dispose()
    return info.status, sum(info.counts.values()), ids


@pytest.mark.parametrize("target", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_newer_export_of_a_present_run_adds_its_missing_results(target, tmp_path, request,
                                                                   capsys):  # fmt: skip
    """An export taken while run 2 was half done, then the export of the whole run: the
    second import printed 'runs none', exited 0 and kept 12 of 32 results."""
    lines = _export(_two_runs(tmp_path), tmp_path / "whole.jsonl")
    head = next(i for i, line in enumerate(lines) if line["kind"] == "run" and line["id"] == 2)
    early = [*lines[:head], {**lines[head], "status": "running", "finished_at": None}]
    early += [line for line in lines[head + 1 :] if line["kind"] == "result"][-12:]  # no BROKEN
    _write_lines(tmp_path / "early.jsonl", early)
    url = request.getfixturevalue("postgres_url") if target == "postgres" else (
        f"sqlite:///{tmp_path / 'central.db'}")  # fmt: skip
    assert main(["import", str(tmp_path / "early.jsonl"), "--db", url]) == 0
    status, count, ids = _stored(url, "2")
    assert (status, count) == ("interrupted", 12) and not ids & BROKEN
    capsys.readouterr()
    assert main(["import", str(tmp_path / "whole.jsonl"), "--db", url]) == 0
    out = capsys.readouterr().out
    assert "import: runs 2\n" in out and "run 2: 2 new regressions" in out, out
    status, count, ids = _stored(url, "2")
    whole = {line["result"]["case"]["id"] for line in lines[head + 1 :] if line["kind"] == "result"}
    assert (status, count, ids) == ("finished", len(whole), whole)
    engine = open_database(url)
    with Session(engine) as session:
        found = list_regressions(session)
    engine.dispose()
    assert {r.case_id for r in found if r.kind == "new_failure"} == BROKEN
    # Once more: nothing is new.
    assert main(["import", str(tmp_path / "whole.jsonl"), "--db", url]) == 0
    assert "import: runs none" in capsys.readouterr().out


def test_a_run_still_running_here_is_not_written_to(tmp_path, capsys):
    url = _two_runs(tmp_path)
    _export(url, tmp_path / "whole.jsonl")
    engine = open_database(url)
    with write_session(engine) as session:
        session.execute(update(Run).where(Run.id == 2).values(status="running"))
    engine.dispose()
    assert main(["import", str(tmp_path / "whole.jsonl"), "--db", url]) == 2
    err = capsys.readouterr().err
    assert "run 2 (uid " in err and "is still running in this database" in err


def _refused(path, lines: list[dict], capsys) -> str:
    _write_lines(path, lines)
    db = path.parent / "never.db"
    assert main(["import", str(path), "--db", f"sqlite:///{db}"]) == 2
    assert not db.exists()  # refused before any database is opened
    return capsys.readouterr().err


def test_a_case_twice_in_a_run_names_both_lines(tmp_path, capsys):
    """A duplicated result line was a 'database failure', exit 3."""
    lines = _export(_two_runs(tmp_path), tmp_path / "whole.jsonl")
    twice = [*lines[:5], lines[3], *lines[5:]]
    err = _refused(tmp_path / "twice.jsonl", twice, capsys)
    case = lines[3]["result"]["case"]["id"]
    assert f"twice.jsonl:6: case {case} again in this run (first at " in err
    assert "twice.jsonl:4)" in err


def test_a_case_id_must_match_its_parameters(tmp_path, capsys):
    lines = _export(_two_runs(tmp_path), tmp_path / "whole.jsonl")
    result = lines[1]["result"]
    case = result["case"]
    moved = {**case, "seqlen": (case["seqlen"] or 0) + 1}  # the same id, other parameters
    lines[1] = {**lines[1], "result": {**result, "case": moved}}
    err = _refused(tmp_path / "moved.jsonl", lines, capsys)
    assert f"moved.jsonl:2: case id '{case['id']}' does not match its parameters (they give " in err


@pytest.mark.parametrize(
    ("field", "value"),
    [("duration_s", -1.5), ("peak_mem_mb", -3.0), ("retries", -1)],
)
def test_durations_and_counts_are_not_negative(tmp_path, capsys, field, value):
    """A negative duration was stored as it came."""
    lines = _export(_two_runs(tmp_path), tmp_path / "whole.jsonl")
    lines[1] = {**lines[1], "result": {**lines[1]["result"], field: value}}
    err = _refused(tmp_path / "negative.jsonl", lines, capsys)
    assert f"negative.jsonl:2: result.{field}: {value!r} (a time or count is >= 0)" in err
