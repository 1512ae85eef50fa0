"""The regression lifecycle over several stored runs, on SQLite and PostgreSQL: a scan per run
raises one alert holding one regression per case and kind, keeps known ones, closes fixed ones
by itself and reopens them when they fail again; side runs and older runs change nothing;
people move regressions along allowed transitions only; the CI outputs (JUnit XML parsed back,
the job summary within its limit) name what the run found, in detail."""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET

import pytest
from reports_support import cases, synthetic_results, tile_plus_one_channel_last, write_run
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult
from convmatrix.db import load_results, open_database
from convmatrix.db.engine import write_session
from convmatrix.db.models import Run
from convmatrix.db.queries import list_runs, resolve_run
from convmatrix.service.alert_pages import regression_page
from convmatrix.service.alerts import get_alert, list_alerts
from convmatrix.service.ci import JobSummary, job_summary_markdown, junit_xml
from convmatrix.service.regressions import list_regressions, regression_events, set_state
from convmatrix.service.scan import scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

N = 40
BROKEN = {c.id for c in cases(N)[:3]}  # the cases a "bad commit" breaks


def _run(engine, broken: bool, commit: str, **kw) -> int:
    bug = (lambda c: c.id in BROKEN) if broken else None
    return write_run(engine, synthetic_results(N, bug=bug, extras=False), commit=commit, **kw)


def _scan(engine, run_id: int):
    with write_session(engine) as session:
        return scan_run(session, run_id)


def test_a_bad_commit_raises_one_alert_with_one_regression_per_case_and_kind(db_url):
    engine = open_database(db_url)
    good = _run(engine, False, "1" * 40)
    assert _scan(engine, good).new == []  # a clean first run: nothing to report
    bad = _run(engine, True, "2" * 40)
    first = _scan(engine, bad)
    assert first.baseline_id == good and first.alert_id is not None
    failures = [r for r in first.new if r.kind == "new_failure"]
    assert sorted(r.case_id for r in failures) == sorted(BROKEN)  # one each, not per output
    assert len(first.new) == len(BROKEN)  # the errors that grew are inside each failure
    assert all(r.alert_id == first.alert_id and r.state == "detected" for r in first.new)
    assert all(r.last_good_run == good and r.first_bad_run == bad for r in first.new)
    with Session(engine) as session:
        results = {r.case.id: r for r in load_results(session, bad)}
        alert = get_alert(session, first.alert_id)
    for reg in failures:  # each failing output named with what was allowed, inside one row
        failing = [o.output for o in results[reg.case_id].outputs if not o.passed]
        listed = [o["output"] for o in reg.outputs]
        assert listed[: len(failing)] == failing
        assert set(listed) == {o.output for o in results[reg.case_id].outputs}  # and the rest
        assert all(o["e_rel"] > o["base_rel"] for o in reg.outputs)  # before and after
        assert reg.detail.startswith("passed -> failed: ")
        assert all(f"{name} e_rel" in reg.detail for name in failing)
    assert (alert.run_id, alert.baseline_run, alert.commit) == (bad, good, "2" * 40)
    assert {r.id for r in alert.regressions} == {r.id for r in first.new}
    assert _scan(engine, bad).new == []  # scanning twice inserts nothing
    with Session(engine) as session:
        assert len(list_alerts(session)) == 1
    engine.dispose()


def test_known_kept_fixed_by_a_run_and_failing_again_is_a_new_regression(db_url):
    engine = open_database(db_url)
    _run(engine, False, "1" * 40)
    first = _scan(engine, _run(engine, True, "2" * 40))
    again = _scan(engine, _run(engine, True, "3" * 40))  # the nightly keeps failing them
    assert again.new == again.reopened == [] and again.alert_id is None
    assert {r.id for r in again.kept} == {r.id for r in first.new}
    fixed_run = _run(engine, False, "4" * 40)
    fixed = _scan(engine, fixed_run)
    assert {r.id for r in fixed.fixed} == {r.id for r in first.new}
    assert all(r.state == "fixed" and r.fixed_run == fixed_run for r in fixed.fixed)
    broken_again = _run(engine, True, "5" * 40)
    back = _scan(engine, broken_again)
    # One regression per cause: new ones, in the new pair's alert; the old ones stay fixed.
    assert back.reopened == [] and len(back.new) == len(first.new)
    assert not {r.id for r in back.new} & {r.id for r in first.new}
    assert back.alert_id not in (None, first.alert_id)
    assert all(r.state == "detected" and r.last_good_run == fixed_run for r in back.new)
    assert all(r.first_bad_run == broken_again for r in back.new)
    with Session(engine) as session:
        old = get_alert(session, first.alert_id)
        events = regression_events(session, first.new[0].id)
    assert {r.id for r in old.regressions} == {r.id for r in first.new}
    assert old.states == {"fixed": len(first.new)}
    assert [(e.from_state, e.to_state, e.by) for e in events] == [
        (None, "detected", "scan"), ("detected", "fixed", "scan"),
    ]  # fmt: skip
    assert back.baseline_id == fixed_run
    engine.dispose()


def test_a_regression_fixed_by_hand_while_failing_is_reopened_in_its_alert(sqlite_url):
    """No run passed the case after a person set it fixed: the same cause, still there. It
    reopens where it is (its alert, first bad run, detail), with an event saying so."""
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    bad = _run(engine, True, "2" * 40)
    first = _scan(engine, bad)
    reg = first.new[0]
    assert main(["regressions", "set", str(reg.id), "fixed", "--by", "ana",
                 "--db", sqlite_url]) == 0  # fmt: skip
    later = _run(engine, True, "3" * 40)
    scan = _scan(engine, later)
    assert [r.id for r in scan.reopened] == [reg.id] and scan.new == []
    with Session(engine) as session:
        (now,) = list_regressions(session, ids=[reg.id])
        events = regression_events(session, reg.id)
    assert now.state == "detected" and now.alert_id == first.alert_id
    assert (now.first_bad_run, now.detail) == (bad, reg.detail)
    assert (events[-2].by, events[-2].to_state) == ("ana", "fixed")
    assert (events[-1].by, events[-1].to_state, events[-1].run_id) == ("scan", "detected", later)
    assert events[-1].note == (
        f"still failing in run {later} (set fixed by ana; no run passed it since)"
    )
    engine.dispose()


def test_set_fixed_by_hand_then_passed_then_failing_is_a_new_regression(sqlite_url):
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    reg = _scan(engine, _run(engine, True, "2" * 40)).new[0]
    with write_session(engine) as session:
        set_state(session, reg.id, "fixed", by="ana")
    passed = _run(engine, False, "3" * 40)
    closed = _scan(engine, passed).fixed  # the two others; the one set fixed is not counted
    assert reg.id not in {r.id for r in closed} and len(closed) == len(BROKEN) - 1
    with Session(engine) as session:
        (now,) = list_regressions(session, ids=[reg.id])
    assert (now.state, now.fixed_run, now.changed_by) == ("fixed", passed, "ana")
    back = _scan(engine, _run(engine, True, "4" * 40))
    assert reg.id not in {r.id for r in back.new} and reg.case_id in {r.case_id for r in back.new}
    assert back.reopened == []
    engine.dispose()


def test_bug_one_fixed_then_bug_two_on_the_same_case_keeps_both_causes(sqlite_url, capsys):
    """The issue's history: run A breaks case X (bug 1, with two other cases), run B fixes
    it, run C breaks X again (bug 2, with another case). Two regressions for X; the first
    still fixed in its alert, whose counts and bug link are as they were."""
    engine = open_database(sqlite_url)
    grid = cases(N)
    x = grid[0].id
    bug_one, bug_two = {x, grid[1].id, grid[2].id}, {x, grid[5].id}

    def run_with(broken: set[str], commit: str) -> int:
        results = synthetic_results(N, bug=lambda c: c.id in broken, extras=False)
        return write_run(engine, results, commit=commit)

    run_with(set(), "0" * 40)
    a = _scan(engine, run_with(bug_one, "a" * 40))
    assert main(["regressions", "set", f"a{a.alert_id}", "acknowledged", "--bug", "BUG-1",
                 "--db", sqlite_url]) == 0  # fmt: skip
    _scan(engine, run_with(set(), "b" * 40))
    c = _scan(engine, run_with(bug_two, "c" * 40))
    assert c.alert_id != a.alert_id and {r.case_id for r in c.new} == bug_two
    capsys.readouterr()
    assert main(["regressions", "--case", x, "--format", "json", "--db", sqlite_url]) == 0
    listed = json.loads(capsys.readouterr().out)
    of_x = {a["id"]: [r for r in a["regressions"] if r["case_id"] == x] for a in listed}
    (old,), (new,) = of_x[a.alert_id], of_x[c.alert_id]
    assert (old["state"], old["bug"], old["first_bad_run"]) == ("fixed", "BUG-1", a.run_id)
    assert (new["state"], new["bug"], new["first_bad_run"]) == ("detected", None, c.run_id)
    with Session(engine) as session:
        first = get_alert(session, a.alert_id)
        page = regression_page(session, sqlite_url, new["id"])
        earlier = regression_page(session, sqlite_url, old["id"])
    assert len(first.regressions) == 3 and first.states == {"fixed": 3}  # as after run B
    assert {r.case_id for r in first.regressions} == bug_one
    # The lineage: each regression's page lists the case's other ones, with their alerts.
    assert [(r.id, r.state, r.alert_id) for r in page.lineage] == [(old["id"], "fixed", a.alert_id)]
    assert [r.id for r in earlier.lineage] == [new["id"]]
    with TestClient(create_app(sqlite_url)) as client:
        html = client.get(f"/regressions/{new['id']}").text
        case = client.get(f"/api/cases/{x}").json()
    assert f'<tr data-regression-id="{old["id"]}"><td class="num"><a href="/regressions/' in html
    assert f'<a href="/alerts/{a.alert_id}">alert {a.alert_id}</a>' in html
    assert {r["id"] for r in case["regressions"]} == {old["id"], new["id"]}
    engine.dispose()


def test_a_run_that_judged_nothing_is_no_baseline(db_url):
    """A nightly whose kernel did not load (every case skipped) sits between a good run and a
    broken one: the broken run is compared with the good run, not with the skips (against
    which its failures would be "new" for a wrong reason, and its fixes invisible)."""
    engine = open_database(db_url)
    good = _run(engine, False, "1" * 40)
    skipped = [CaseResult(r.case, "skipped", message="kernel did not load")
               for r in synthetic_results(N, extras=False)]  # fmt: skip
    write_run(engine, skipped, commit="2" * 40)
    scan = _scan(engine, _run(engine, True, "3" * 40))
    assert scan.baseline_id == good
    assert {r.case_id for r in scan.new} == BROKEN
    engine.dispose()


def test_side_runs_are_neither_scanned_nor_baselines(sqlite_url):
    engine = open_database(sqlite_url)
    good = _run(engine, False, "1" * 40)
    side = _run(engine, True, "2" * 40, label="confirm:1", kind="confirm")
    assert _scan(engine, side).skipped == "a confirm run is never scanned"
    bad = _run(engine, True, "3" * 40)
    assert _scan(engine, bad).baseline_id == good
    _run(engine, False, "4" * 40, kind="bisect")
    with Session(engine) as session:
        assert resolve_run(session, "latest").id == bad  # never the bisect run
        assert resolve_run(session, "4" * 8).kind == "bisect"  # named, it is found
        assert [r.id for r in list_runs(session)] == [bad, good]  # the index: plain runs
    engine.dispose()


def test_an_older_run_fills_history_and_changes_no_regression(sqlite_url):
    # An import of an old good run must not close what a newer run found (by time order).
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    bad = _run(engine, True, "2" * 40)
    found = _scan(engine, bad)
    old = _run(engine, False, "0" * 40)
    with write_session(engine) as session:  # started before every other run
        session.get(Run, old).started_at = session.get(Run, 1).started_at.replace(year=2000)
    scan = _scan(engine, old)
    assert scan.skipped and scan.fixed == [] and scan.new == []
    with Session(engine) as session:
        assert {r.state for r in list_regressions(session)} == {"detected"}
        assert len(list_regressions(session)) == len(found.new)
    engine.dispose()


def test_the_explanation_names_the_dimension_that_separates_failing_cases(sqlite_url):
    engine = open_database(sqlite_url)
    results = synthetic_results(N * 3, extras=False)
    write_run(engine, results, commit="1" * 40)
    broken = synthetic_results(N * 3, bug=tile_plus_one_channel_last, extras=False)
    bad = write_run(engine, broken, commit="2" * 40)
    scan = _scan(engine, bad)
    with Session(engine) as session:
        alert = get_alert(session, scan.alert_id)
    best = alert.explanation[0]
    failing = {r.case.id for r in broken if tile_plus_one_channel_last(r.case)}
    # A pair of dimensions (the bug needs both) separates them exactly.
    assert set(best["dimensions"]) == {"seqlen", "layout"}
    assert (best["failing_in"], best["failing"], best["passing_in"]) == (
        len(failing), len(failing), 0,
    )  # fmt: skip
    values = dict(zip(best["dimensions"], best["values"][0].split(" / "), strict=True))
    assert values == {"seqlen": "tile+1", "layout": "channel_last"}
    assert best["text"].endswith(f"{len(failing)} of {len(failing)} failing cases, 0 of "
                                 f"{len(broken) - len(failing)} passing")  # fmt: skip
    engine.dispose()


def test_transitions_people_may_make(sqlite_url, capsys):
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    scan = _scan(engine, _run(engine, True, "2" * 40))
    reg = scan.new[0].id
    db = ["--db", sqlite_url]
    assert main(["regressions", "set", str(reg), "acknowledged", "--by", "ana", *db,
                 "--note", "tile bug, PR 12", "--assign", "bo", "--bug", "PR-12"]) == 0  # fmt: skip
    assert main(["regressions", "set", str(reg), "ignored", "--by", "ana", *db]) == 2
    assert "say why it is ignored" in capsys.readouterr().err
    assert main(["regressions", "set", str(reg), "invalid", "--by", "ana", *db,
                 "--note", "a broken card"]) == 0  # fmt: skip
    assert main(["regressions", "set", str(reg), "fixed", "--by", "ana", *db]) == 2
    assert "is invalid: it can become detected, not fixed" in capsys.readouterr().err
    assert main(["regressions", *db, "set", str(reg), "detected", "--by", "bo"]) == 0  # reopen
    assert main(["regressions", "set", "999", "fixed", *db]) == 2
    capsys.readouterr()
    assert main(["regressions", "show", f"r{reg}", *db]) == 0
    shown = capsys.readouterr().out
    assert "ana: detected -> acknowledged: tile bug, PR 12" in shown
    triaged = "ana: acknowledged -> acknowledged: assigned to bo; bug PR-12"
    assert triaged in shown
    assert (
        "ana: acknowledged -> invalid: a broken card" in shown
        and "bo: invalid -> detected" in shown
    )
    assert main(["regressions", "--format", "json", *db]) == 0
    (listed,) = json.loads(capsys.readouterr().out)  # one alert, its regressions inside
    assert listed["id"] == scan.alert_id
    assert {r["id"] for r in listed["regressions"]} == {r.id for r in scan.new}
    mine = next(r for r in listed["regressions"] if r["id"] == reg)
    assert (mine["assignee"], mine["bug"]) == ("bo", "PR-12")
    with write_session(engine) as session, pytest.raises(UsageError, match="choose from"):
        set_state(session, reg, "gone", by="x")
    engine.dispose()


@pytest.mark.parametrize("target", ["99999999999", "2147483648", "\u00b2"])
def test_an_id_no_row_can_have_is_no_such_row_on_every_database(db_url, capsys, target):
    """Past the id column's INTEGER (PostgreSQL refused it: exit 3, "database failure") or a
    digit ``int`` reads but no row id is (``²``): exit 2, "no such ...", in every spelling."""
    engine = open_database(db_url)
    _run(engine, False, "1" * 40)
    engine.dispose()
    for argv in (["show", target], ["show", f"r{target}"], ["set", target, "fixed"],
                 ["set", f"a{target}", "fixed"]):  # fmt: skip
        assert main(["regressions", *argv, "--db", db_url]) == 2, argv
        err = capsys.readouterr().err
        assert "no such" in err and "database" not in err, (argv, err)


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
            failing = [o.output for o in result.outputs if not o.passed]
            assert all(f"{name} e_rel" in failure.get("message") for name in failing)
        elif result.outcome in ("crashed", "timeout", "error"):
            assert error is not None and error.get("type") == result.outcome
        else:
            assert failure is None and error is None
    assert int(suite.get("failures")) == sum(r.outcome == "failed" for r in results) == 3
    assert int(suite.get("errors")) == 1 and int(suite.get("skipped")) == 1  # the extras
    assert "<script>" not in junit_xml("x", results).decode()  # escaped, as XML must be
    engine.dispose()


def test_junit_xml_stays_well_formed_for_any_kernel_text():
    (case,) = cases(1)
    coloured = "\x1b[31mRuntimeError\x1b[0m: bad \x00 byte \x07 and \udc80"
    result = CaseResult(case, "error", message=coloured)
    root = ET.fromstring(junit_xml("run \x1b[1m1", [result]))  # a standard parser reads it
    error = root.find("testsuite/testcase/error")
    assert error.get("message").startswith("\\x1b[31mRuntimeError\\x1b[0m: bad \\x00 byte")


def test_the_summary_names_every_failing_case_once_with_detail_and_links(sqlite_url):
    engine = open_database(sqlite_url)
    _run(engine, False, "1" * 40)
    bad = _run(engine, True, "2" * 40)
    scan = _scan(engine, bad)
    with Session(engine) as session:
        results = load_results(session, bad)
    base = "http://ci.example:8000/"
    summary = JobSummary(bad, "tiled (run 2)", {"passed": 37, "failed": 3}, results,
                         baseline_id=scan.baseline_id, alert_id=scan.alert_id,
                         raised=scan.alerting, explanation=["x in {1}"])  # fmt: skip
    text = job_summary_markdown(summary, base_url=base)
    assert "FAILED" in text and "| 37 | 3 |" in text
    assert f"**{len(scan.new)} new regressions** ([alert {scan.alert_id}]" in text
    assert f"(http://ci.example:8000/diff/1/{bad})" in text and "Where: x in {1}" in text
    for reg in scan.new:
        assert f"[#{reg.id}](http://ci.example:8000/regressions/{reg.id})" in text
        assert reg.detail.replace("|", "\\|") in text
    assert "Other failing cases" not in text  # every failing case is a new one: named once
    # The next night: the same failures, all known; the summary still names them.
    again = _run(engine, True, "3" * 40)
    known = _scan(engine, again)
    with Session(engine) as session:
        results = load_results(session, again)
    quiet = JobSummary(again, "tiled (run 3)", {"passed": 37, "failed": 3}, results,
                       baseline_id=known.baseline_id, known=len(known.kept))  # fmt: skip
    text = job_summary_markdown(quiet, base_url=base)
    assert "**0 new regressions**" in text and "### Failing cases (3)" in text
    assert all(f"/cases/{case_id})" in text for case_id in BROKEN)
    assert text.count(next(iter(BROKEN))) == 2  # the link's text and its target, one row
    # Many rows: cut to the limit with a line saying how much was left out and where.
    big = JobSummary(bad, "t", {"failed": 3}, results * 2000, baseline_id=1)
    cut = job_summary_markdown(big, base_url=base, limit=64 * 1024)
    assert len(cut.encode()) <= 64 * 1024
    assert "more rows left out (summary limit): see [the report of run" in cut
    engine.dispose()
