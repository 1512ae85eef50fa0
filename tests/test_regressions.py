"""The regression lifecycle over several stored runs, on SQLite and PostgreSQL: a scan per run
inserts new regressions once, keeps known ones, closes fixed ones by itself; people move them
along allowed transitions only; the CI outputs (JUnit XML parsed back, the markdown summary
within its limit) name what the scan found."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from reports_support import cases, synthetic_results, write_run
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.core.errors import UsageError
from convmatrix.db import load_results, open_database
from convmatrix.db.engine import write_session
from convmatrix.service.ci import job_summary_markdown, junit_xml
from convmatrix.service.regressions import (
    list_regressions,
    regression_events,
    scan_run,
    set_state,
)

N = 40
BROKEN = {c.id for c in cases(N)[:3]}  # the cases a "bad commit" breaks


def _run(engine, broken: bool, commit: str, **kw) -> int:
    bug = (lambda c: c.id in BROKEN) if broken else None
    return write_run(engine, synthetic_results(N, bug=bug, extras=False), commit=commit, **kw)


def _scan(engine, run_id: int):
    with write_session(engine) as session:
        return scan_run(session, run_id)


def test_a_failure_is_new_once_and_closes_itself_when_fixed(db_url):
    engine = open_database(db_url)
    good = _run(engine, False, "1" * 40)
    assert _scan(engine, good).new == []  # a clean first run: nothing to report
    bad = _run(engine, True, "2" * 40)
    first = _scan(engine, bad)
    assert first.baseline_id == good
    failures = [r for r in first.new if r.kind == "new_failure"]
    assert {r.case_id for r in failures} == BROKEN
    errors = [r for r in first.new if r.kind == "error_regression"]
    assert {r.case_id for r in errors} == BROKEN  # O(1) errors where there were roundoffs
    assert all(r.state == "detected" for r in first.new)
    assert all(r.last_good_run == good and r.first_bad_run == bad for r in first.new)
    assert all(r.first_bad_commit == "2" * 40 for r in first.new)
    assert _scan(engine, bad).new == []  # scanning twice inserts nothing

    again = _run(engine, True, "3" * 40)  # the nightly keeps failing the same cases
    second = _scan(engine, again)
    assert second.new == [] and {r.id for r in second.kept} == {r.id for r in first.new}

    fixed_run = _run(engine, False, "4" * 40)
    third = _scan(engine, fixed_run)
    assert {r.id for r in third.fixed} == {r.id for r in first.new}
    assert all(r.state == "fixed" and r.fixed_run == fixed_run for r in third.fixed)
    with Session(engine) as session:
        assert list_regressions(session, states=["detected"]) == []
        events = regression_events(session, first.new[0].id)
    assert [(e.from_state, e.to_state, e.by) for e in events] == [
        (None, "detected", "scan"),
        ("detected", "fixed", "scan"),
    ]
    assert events[1].run_id == fixed_run

    broken_again = _run(engine, True, "5" * 40)  # a fixed regression that comes back is new
    fourth = _scan(engine, broken_again)
    assert {r.case_id for r in fourth.new if r.kind == "new_failure"} == BROKEN
    assert all(r.last_good_run == fixed_run for r in fourth.new)
    engine.dispose()


def test_side_runs_are_neither_scanned_nor_baselines(sqlite_url):
    engine = open_database(sqlite_url)
    good = _run(engine, False, "1" * 40)
    _run(engine, True, "2" * 40, label="confirm:1")  # a rerun of a few cases
    assert _scan(engine, 2).new == []
    bad = _run(engine, True, "3" * 40)
    assert _scan(engine, bad).baseline_id == good
    engine.dispose()


def test_transitions_people_may_make(sqlite_url, capsys):
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    scan = _scan(engine, _run(engine, True, "2" * 40))
    reg = scan.new[0].id
    db = ["--db", sqlite_url]
    assert main(["regressions", "set", str(reg), "acknowledged", "--by", "ana", *db,
                 "--note", "tile bug, PR 12"]) == 0  # fmt: skip
    assert main(["regressions", "set", str(reg), "detected", "--by", "ana", *db]) == 2
    assert "is acknowledged: it can become confirmed, ignored, fixed, not detected" in (
        capsys.readouterr().err
    )
    assert main(["regressions", *db, "set", str(reg), "fixed", "--by", "bo"]) == 0
    assert main(["regressions", "set", str(reg), "detected", "--by", "bo", *db]) == 0  # reopen
    assert main(["regressions", "set", "999", "fixed", *db]) == 2
    capsys.readouterr()
    assert main(["regressions", "show", str(reg), *db]) == 0
    shown = capsys.readouterr().out
    assert "ana: detected -> acknowledged: tile bug, PR 12" in shown
    assert "bo: acknowledged -> fixed" in shown and "bo: fixed -> detected" in shown
    assert main(["regressions", "--state", "detected", "--format", "json", *db]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in listed} == {r.id for r in scan.new}
    assert next(r for r in listed if r["id"] == reg)["note"] == "tile bug, PR 12"
    with write_session(engine) as session, pytest.raises(UsageError, match="choose from"):
        set_state(session, reg, "gone", by="x")
    engine.dispose()


def test_junit_xml_parses_back_with_one_testcase_per_case(sqlite_url):
    engine = open_database(sqlite_url)
    run = write_run(engine, synthetic_results(N, bug=lambda c: c.id in BROKEN))
    with Session(engine) as session:
        results = load_results(session, run)
    root = ET.fromstring(junit_xml("tiled (run 1)", results))
    suite = root.find("testsuite")
    assert suite is not None
    testcases = suite.findall("testcase")
    assert len(testcases) == len(results) == int(suite.get("tests"))
    by_id = {t.get("id"): t for t in testcases}
    for result in results:
        element = by_id[result.case.id]
        failure, error = element.find("failure"), element.find("error")
        if result.outcome == "failed":
            assert failure is not None and result.case.pytest_id in failure.text
            assert "e_rel" in failure.text  # the verdict's lines, output by output
        elif result.outcome in ("crashed", "timeout", "error"):
            assert error is not None and error.get("type") == result.outcome
        else:
            assert failure is None and error is None
    assert int(suite.get("failures")) == sum(r.outcome == "failed" for r in results) == 3
    assert int(suite.get("errors")) == 1 and int(suite.get("skipped")) == 1  # the extras
    assert "<script>" not in junit_xml("x", results).decode()  # escaped, as XML must be
    engine.dispose()


def test_the_summary_names_new_regressions_with_links_and_stays_under_its_limit(sqlite_url):
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    bad = _run(engine, True, "2" * 40)
    scan = _scan(engine, bad)
    text = job_summary_markdown(bad, "tiled (run 2)", {"passed": 37, "failed": 3}, scan,
                            base_url="http://ci.example:8000/")  # fmt: skip
    assert "FAILED" in text and "| 37 | 3 |" in text
    assert f"**{len(scan.new)} new regressions**" in text
    assert f"(http://ci.example:8000/diff/1/{bad})" in text
    for case_id in BROKEN:
        assert f"[{case_id}](http://ci.example:8000/cases/{case_id})" in text
    # Many regressions: cut to the limit with a line saying how much was left out.
    scan.new = scan.new * 5000
    big = job_summary_markdown(bad, "tiled (run 2)", {"failed": 3}, scan, limit=64 * 1024)
    assert len(big.encode()) <= 64 * 1024
    assert "more lines left out (summary limit)" in big
    engine.dispose()
