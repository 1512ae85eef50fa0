"""Triage through ``convmatrix serve``: the alert and regression pages and their JSON, the write
API behind the bearer token (every status it answers), and the pages in headless Chromium
through the real server: read without a token, acknowledge through the form, anchors, the
sort and filter state in the address, the compare picker.

Every test that writes works on its own copy of the module's database.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
import shutil
import threading
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import test_browser
from reports_support import cases, synthetic_results, write_run
from sqlalchemy.exc import OperationalError
from test_serve import running_server

from convmatrix.cli import main
from convmatrix.core.errors import UsageError
from convmatrix.core.records import PropertyResult
from convmatrix.db import open_database
from convmatrix.db.engine import write_session
from convmatrix.reports.render import content_policy
from convmatrix.service.access import TOKEN_ENV, read_token, write_refusal
from convmatrix.service.regressions import TRANSITIONS
from convmatrix.service.scan import scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service import app as app_module
from convmatrix.service.app import create_app

browser = test_browser.browser
open_url = test_browser.open_url

TOKEN = "s3cret-token-for-tests"
FIRST = sorted(c.id for c in cases(60)[:2])  # broken in run 2 (alert 1), and in run 3
LATER = cases(60)[5].id  # broken from run 3 on (alert 2)
PROPERTY = "causality"


def _with_usage(results, broken):
    """Bound usage on every output (a broken output far past its allowed 1), and a failed
    property check on the first broken case."""
    out = []
    for r in results:
        if not r.outputs:
            out.append(r)
            continue
        outputs = [
            dataclasses.replace(m, bound_usage=m.e_rel * 200, usage_limit=1.0) for m in r.outputs
        ]
        props = [PropertyResult(PROPERTY, False, "y[:4] moved when x[9:] did")]
        props = props if r.case.id == FIRST[0] and broken(r.case) else []
        out.append(dataclasses.replace(r, outputs=outputs, properties=props))
    return out


def _run(engine, bug, commit, *, scan=True):
    results = _with_usage(synthetic_results(60, bug=bug, timed_every=3), bug)
    run = write_run(engine, results, commit=commit * 40)
    if scan:
        with write_session(engine) as session:
            scan_run(session, run)
    return run


def _fill(url: str) -> None:
    """Run 1 good (not scanned: its crashed extra case would make an alert of its own); run 2
    breaks FIRST (alert 1); run 3 still breaks them and breaks LATER too (alert 2)."""
    engine = open_database(url)
    assert _run(engine, lambda c: False, "1", scan=False) == 1
    assert _run(engine, lambda c: c.id in FIRST, "2") == 2
    assert _run(engine, lambda c: c.id in FIRST or c.id == LATER, "3") == 3
    engine.dispose()


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """The module's database file, and the static run and diff reports the CLI writes."""
    out = tmp_path_factory.mktemp("triage")
    url = f"sqlite:///{out / 'results.db'}"
    _fill(url)
    assert main(["report", "2", "--db", url, "--out", str(out)]) == 1
    assert main(["diff", "1", "2", "--db", url, "--out", str(out / "diff.html")]) == 0
    return out


@pytest.fixture
def db_copy(database, tmp_path) -> str:
    """A copy of the module's database that one test may change."""
    for name in ("results.db", "results.db-wal", "results.db-shm"):
        if (database / name).exists():
            shutil.copy(database / name, tmp_path / name)
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture
def client(db_copy):
    with TestClient(create_app(db_copy, token=TOKEN)) as c:
        yield c


@pytest.fixture(scope="module")
def reader(database):
    """A client of the module's database itself, for tests that only read."""
    with TestClient(create_app(f"sqlite:///{database / 'results.db'}", token=TOKEN)) as c:
        yield c


def _post(client, path, body, *, token=TOKEN, headers=None, raw=None):
    sent = {"Content-Type": "application/json"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent.update(headers or {})
    data = raw if raw is not None else json.dumps(body).encode()
    return client.post(path, content=data, headers=sent)


def _alert_regressions(client, alert_id):
    return client.get(f"/api/alerts/{alert_id}").json()["alert"]["regressions"]


# -- reading -------------------------------------------------------------------------------


def test_the_alerts_index_newest_first_and_filtered(reader):
    index = reader.get("/api/regressions").json()
    assert index["kind"] == "alerts"
    assert [a["id"] for a in index["alerts"]] == [2, 1]
    assert {r["case_id"] for r in index["alerts"][1]["regressions"]} == set(FIRST)
    assert {r["case_id"] for r in index["alerts"][0]["regressions"]} == {LATER}
    assert index["counts"] == {"detected": 3}  # 3 cases, one regression each (new failures)
    assert reader.get("/api/regressions?kernel=tiled").json()["alerts"] == index["alerts"]
    assert reader.get("/api/regressions?kernel=other").json()["alerts"] == []
    assert reader.get("/api/regressions?state=acknowledged").json()["alerts"] == []
    page = reader.get("/regressions?state=detected")
    assert page.status_code == 200
    assert 'href="/alerts/2"' in page.text and 'href="/alerts/1"' in page.text
    assert '<input type="checkbox" name="state" value="detected" checked>' in page.text


def test_the_alert_json_holds_what_a_person_decides_with(reader):
    view = reader.get("/api/alerts/1").json()
    alert = view["alert"]
    assert (alert["run_id"], alert["baseline_run"]) == (2, 1)
    assert alert["commit"] == "2" * 40 and alert["baseline_commit"] == "1" * 40
    assert alert["explanation"] and all(e["text"] for e in alert["explanation"])
    regs = alert["regressions"]
    assert {(r["case_id"], r["kind"]) for r in regs} == {(c, "new_failure") for c in FIRST}
    new = next(r for r in regs if r["kind"] == "new_failure" and r["case_id"] == FIRST[0])
    assert new["outputs"] and all(o["usage"] > o["allowed"] == 1.0 for o in new["outputs"])
    assert all(o["base_usage"] < 1 for o in new["outputs"])
    assert new["properties"] == [{"name": PROPERTY, "detail": "y[:4] moved when x[9:] did"}]
    assert [e["to_state"] for e in new["events"]] == ["detected"]
    assert new["events"][0]["by"] == "scan" and new["events"][0]["run_id"] == 2
    assert "acknowledged" in new["allowed"] and "detected" not in new["allowed"]
    # Each case over the runs around the alert: passed at the baseline, failed since.
    assert [r["run_id"] for r in view["runs"]] == [1, 2, 3]
    assert [r["role"] for r in view["runs"]] == ["baseline", "alert", ""]
    assert [p["outcome"] for p in new["history"]] == ["passed", "failed", "failed"]
    assert new["history"][1]["usage"] > 1 > new["history"][0]["usage"]
    # The rerun: the commit to check out, then every case of the alert.
    assert view["rerun"]["commit"] == "2" * 40
    assert all(f"--case {c}" in view["rerun"]["command"] for c in FIRST)
    assert view["allowed"] == ["confirmed", "flaky", "acknowledged", "ignored", "invalid", "fixed"]


def test_the_alert_page_shows_cases_history_rerun_and_events(reader):
    page = reader.get("/alerts/1").text
    assert f"git checkout {'2' * 40}\nconvmatrix run --matrix nightly" in page
    for case_id in FIRST:
        assert f'id="case-{case_id}"' in page
        assert f'href="/runs/2#case-{case_id}"' in page  # a history point links to its run
        assert f'href="/cases/{case_id}"' in page
    assert f"property <b>{PROPERTY}</b> failed" in page
    assert "usage" in page and "allowed 1" in page
    assert 'href="/diff/1/2"' in page
    assert "not bisected: <code>convmatrix bisect --good " in page
    assert 'data-events-of="' in page
    assert 'id="triage"' in page and TOKEN not in page  # the form, never the token


def test_the_regression_page_and_json(reader):
    reg_id = next(r["id"] for r in _alert_regressions(reader, 1) if r["kind"] == "new_failure")
    view = reader.get(f"/api/regressions/{reg_id}").json()
    reg = view["regression"]
    assert view["kind"] == "regression" and reg["id"] == reg_id
    assert view["alert"]["id"] == 1
    assert view["rerun"]["commit"] == reg["first_bad_commit"] == "2" * 40
    assert view["rerun"]["command"].endswith(f"--case {reg['case_id']}")
    assert [p["outcome"] for p in reg["history"]] == ["passed", "failed", "failed"]
    page = reader.get(f"/regressions/{reg_id}").text
    assert f"git checkout {'2' * 40}" in page
    assert f'href="/diff/1/2#case-{reg["case_id"]}"' in page
    assert 'href="/alerts/1"' in page and f'data-state-of="{reg_id}"' in page


def test_run_diff_and_case_pages_link_each_other(reader, database):
    case_id = FIRST[0]
    run = reader.get("/runs/2").text
    assert f'id="case-{case_id}"' in run
    assert f'href="/cases/{case_id}"' in run
    regs = [r for r in _alert_regressions(reader, 1) if r["case_id"] == case_id]
    assert all(f'href="/regressions/{r["id"]}"' in run for r in regs)
    assert 'href="/history/float32?kernel=tiled"' in run
    diff = reader.get("/diff/1/2").text
    assert f'href="/runs/2#case-{case_id}"' in diff and f'id="case-{case_id}"' in diff
    assert 'id="history-links"' in diff
    # The new failure names its failing outputs with usage and allowed, and its property.
    assert "allowed 1" in diff and f"property <b>{PROPERTY}</b> failed" in diff
    case = reader.get(f"/cases/{case_id}").text
    assert f'href="/runs/2#case-{case_id}"' in case and 'id="history-link"' in case
    assert all(f'href="/regressions/{r["id"]}"' in case for r in regs)
    # The static reports keep their anchors and link nowhere the disk has not.
    static_run = (database / "run-2.html").read_text()
    static_diff = (database / "diff.html").read_text()
    assert f'id="case-{case_id}"' in static_run and f'id="case-{case_id}"' in static_diff
    for static in (static_run, static_diff):
        assert 'href="/cases/' not in static and 'href="/runs/' not in static


def test_the_compare_picker(reader):
    index = reader.get("/").text
    assert '<form id="compare" method="get" action="/diff">' in index
    answer = reader.get("/diff?base=1&head=3", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/diff/1/3"
    assert reader.get("/diff?base=1").status_code == 400


def test_served_pages_may_fetch_themselves_static_reports_fetch_nothing(reader, database):
    policy = reader.get("/alerts/1").headers["content-security-policy"]
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy.split("script-src")[1]
    static = (database / "run-2.html").read_text()
    assert "Content-Security-Policy" in static and "connect-src" not in static
    assert "connect-src" not in content_policy()


# -- the token -----------------------------------------------------------------------------


def test_the_token_comes_from_the_file_or_the_environment(tmp_path):
    assert read_token(None, {}) is None
    assert read_token(None, {TOKEN_ENV: "  "}) is None
    assert read_token(None, {TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    path = tmp_path / "token"
    path.write_text("from-file-0123456789\n")
    assert read_token(path, {TOKEN_ENV: TOKEN}) == "from-file-0123456789"  # the file wins
    path.write_text(" \n")
    with pytest.raises(UsageError, match=r"--token-file .*token: the file is empty"):
        read_token(path, {TOKEN_ENV: TOKEN})
    with pytest.raises(UsageError, match=r"--token-file .*cannot read it"):
        read_token(tmp_path / "missing", {})
    path.write_text("two words")
    with pytest.raises(UsageError, match="one word"):
        read_token(path, {})


def test_serve_refuses_an_empty_token_file(database, tmp_path, capsys):
    empty = tmp_path / "token"
    empty.write_text("\n")
    url = f"sqlite:///{database / 'results.db'}"
    assert main(["serve", "--db", url, "--token-file", str(empty)]) == 2
    assert "--token-file" in capsys.readouterr().err


def test_write_refusals_in_order():
    same = "http://127.0.0.1:8000"
    good = {"authorization": f"Bearer {TOKEN}"}

    def why(token, headers):
        refusal = write_refusal(token, headers, same)
        assert refusal is None or refusal.status == 403
        return refusal and refusal.reason

    assert why(None, good).startswith("read-only")
    assert why(TOKEN, good) is None
    assert why(TOKEN, {**good, "origin": same}) is None
    assert why(TOKEN, {**good, "sec-fetch-site": "same-origin"}) is None
    assert "Origin" in why(TOKEN, {**good, "origin": "http://evil.example"})
    assert "Origin" in why(TOKEN, {**good, "origin": "null"})
    assert "cross-site" in why(TOKEN, {**good, "sec-fetch-site": "cross-site"})
    assert "same-site" in why(TOKEN, {**good, "sec-fetch-site": "same-site"})
    assert "needs the header" in why(TOKEN, {})
    assert "needs the header" in why(TOKEN, {"authorization": f"Basic {TOKEN}"})
    assert why(TOKEN, {"authorization": "Bearer nope"}) == "refused: wrong token"
    assert why(TOKEN, {"authorization": f"bearer  {TOKEN} "}) is None


# -- writing: every status -----------------------------------------------------------------


def test_writes_need_the_token(client):
    reg = _alert_regressions(client, 1)[0]
    path = f"/api/regressions/{reg['id']}"
    missing = _post(client, path, {"state": "acknowledged"}, token=None)
    assert missing.status_code == 403 and "Authorization: Bearer" in missing.text
    wrong = _post(client, path, {"state": "acknowledged"}, token="guess")
    assert wrong.status_code == 403 and "wrong token" in wrong.text
    assert client.get(path).json()["regression"]["state"] == "detected"  # nothing changed
    done = _post(client, path, {"state": "acknowledged"}, headers={"X-Convmatrix-User": "ana"})
    assert done.status_code == 200
    [after] = done.json()["regressions"]
    assert after["state"] == "acknowledged" and after["changed_by"] == "ana"
    last = after["events"][-1]
    assert (last["by"], last["from_state"], last["to_state"]) == ("ana", "detected", "acknowledged")
    assert last["at"]  # when
    # The `by` field wins over the header; no name at all is "web".
    body = {"note": "looking at the halo code", "by": "bo"}
    noted = _post(client, path, body, headers={"X-Convmatrix-User": "ana"}).json()
    assert noted["regressions"][0]["events"][-1]["by"] == "bo"
    assigned = _post(client, path, {"assignee": "cy"}).json()["regressions"][0]
    assert assigned["assignee"] == "cy" and assigned["events"][-1]["by"] == "web"


def test_cross_site_writes_are_refused(client):
    reg = _alert_regressions(client, 1)[0]
    path = f"/api/regressions/{reg['id']}"
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        answer = _post(client, path, {"state": "acknowledged"}, headers=headers)
        assert answer.status_code == 403, headers
        assert answer.text.startswith("convmatrix serve: refused: "), headers
    assert client.get(path).json()["regression"]["state"] == "detected"
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    assert _post(client, path, {"state": "acknowledged"}, headers=same).status_code == 200
    # A form cannot send JSON: anything else is refused before it is read.
    form = client.post(
        path, content=b"state=fixed", headers={"Authorization": f"Bearer {TOKEN}",
                                               "Content-Type": "application/x-www-form-urlencoded"}
    )  # fmt: skip
    assert form.status_code == 415


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b'["acknowledged"]', "must be a JSON object"),
        (b'{"state": "acknowledged", "color": "red"}', "unknown field 'color'"),
        (b'{"state": 3}', "state: give a string"),
        (b'{"state": "gone"}', "state 'gone': choose from detected"),
        (b"{}", "nothing to change"),
        (b'{"note": "   "}', "nothing to change"),
        (b'{"state": "ignored"}', "say why it is ignored (a note)"),
        (b'{"state": "invalid", "note": ""}', "say why it is invalid (a note)"),
        (b'{"state": "detected"}', None),  # detected -> detected: nothing to do, allowed
    ],
)
def test_bad_bodies_are_400_with_the_reason(client, body, message):
    reg = _alert_regressions(client, 1)[0]
    answer = _post(client, f"/api/regressions/{reg['id']}", None, raw=body)
    if message is None:
        assert answer.status_code == 200
        return
    assert answer.status_code == 400, answer.text
    assert message in answer.text
    assert (
        client.get(f"/api/regressions/{reg['id']}").json()["regression"]["events"] == reg["events"]
    )


def test_a_body_over_64_kib_is_413(client):
    reg = _alert_regressions(client, 1)[0]
    note = {"note": "x" * (70 * 1024)}
    answer = _post(client, f"/api/regressions/{reg['id']}", note)
    assert answer.status_code == 413 and "over 65536 bytes" in answer.text
    assert client.get(f"/api/regressions/{reg['id']}").json()["regression"]["note"] is None


def test_a_database_that_refuses_the_write_is_503_and_changes_nothing(db_copy, monkeypatch):
    def locked(session, target, change):
        raise OperationalError("UPDATE regressions", {}, Exception("database is locked"))

    monkeypatch.setitem(app_module.WRITES, "/api/regressions/{id}", locked)
    with TestClient(create_app(db_copy, token=TOKEN)) as c:
        answer = _post(c, "/api/regressions/1", {"state": "acknowledged"})
        assert answer.status_code == 503
        assert "nothing changed" in answer.text and "database is locked" in answer.text


def test_a_move_the_lifecycle_forbids_is_400_naming_the_allowed_ones(client):
    reg = _alert_regressions(client, 1)[0]
    path = f"/api/regressions/{reg['id']}"
    assert _post(client, path, {"state": "fixed", "note": "by hand"}).status_code == 200
    refused = _post(client, path, {"state": "acknowledged"})
    assert refused.status_code == 400
    assert "is fixed: it can become detected, not acknowledged" in refused.text


def test_unknown_ids_are_404(client):
    for path in ("/api/regressions/999", "/api/alerts/999", "/api/regressions/x1"):
        answer = _post(client, path, {"state": "acknowledged"})
        assert answer.status_code == 404, path
    assert (
        _post(client, "/api/regressions/999", {"state": "acknowledged"}, token=None).status_code
        == 403
    )


def test_each_triage_action_is_an_event_with_who(client):
    reg = _alert_regressions(client, 1)[0]
    path = f"/api/regressions/{reg['id']}"
    steps = [
        ({"state": "acknowledged"}, "acknowledged"),
        ({"assignee": "ana"}, "acknowledged"),
        ({"bug": "https://tracker.example/31"}, "acknowledged"),
        ({"note": "halo wrong past one tile"}, "acknowledged"),
        ({"state": "ignored", "note": "known upstream, fixed in 2.1"}, "ignored"),
        ({"state": "detected"}, "detected"),  # reopen
        ({"state": "invalid", "note": "the matrix was wrong"}, "invalid"),
        ({"state": "detected", "assignee": ""}, "detected"),  # reopen, unassign
    ]
    for body, state in steps:
        answer = _post(client, path, {**body, "by": "dee"})
        assert answer.status_code == 200, (body, answer.text)
        assert answer.json()["regressions"][0]["state"] == state
    after = client.get(path).json()["regression"]
    assert after["bug"] == "https://tracker.example/31" and after["assignee"] is None
    events = after["events"][1:]  # after the scan's
    assert all(e["by"] == "dee" for e in events)
    assert [e["to_state"] for e in events] == [
        "acknowledged", "acknowledged", "acknowledged", "acknowledged", "ignored", "detected",
        "invalid", "detected", "detected",
    ]  # fmt: skip
    notes = [e["note"] for e in events]
    assert "assigned to ana" in notes and "bug https://tracker.example/31" in notes
    assert "known upstream, fixed in 2.1" in notes and "unassigned" in notes


def test_an_alert_write_changes_each_regression_that_can_move(client):
    regs = _alert_regressions(client, 1)
    fixed = regs[0]["id"]
    done = _post(client, f"/api/regressions/{fixed}", {"state": "fixed", "note": "x"})
    assert done.status_code == 200
    answer = _post(client, "/api/alerts/1", {"state": "acknowledged", "by": "eve"})
    assert answer.status_code == 200
    result = answer.json()
    states = {r["id"]: r["state"] for r in result["regressions"]}
    assert states == {r["id"]: ("fixed" if r["id"] == fixed else "acknowledged") for r in regs}
    assert [s["id"] for s in result["skipped"]] == [fixed]
    assert "fixed: it can become detected" in result["skipped"][0]["reason"]
    for r in result["regressions"]:
        if r["id"] != fixed:
            assert r["events"][-1]["by"] == "eve"
    # Neither an acknowledged nor a fixed regression can become flaky: 400, nothing changed.
    none_can = _post(client, "/api/alerts/1", {"state": "flaky"})
    assert (
        none_can.status_code == 400 and "none of its regressions can become flaky" in none_can.text
    )
    # An ignore without a reason changes nothing, for any of them.
    assert _post(client, "/api/alerts/1", {"state": "ignored"}).status_code == 400
    assert {r["state"] for r in _alert_regressions(client, 1)} == {"acknowledged", "fixed"}
    # Alert 2 is untouched.
    assert {r["state"] for r in _alert_regressions(client, 2)} == {"detected"}


def test_writes_on_both_backends(db_url):
    _fill(db_url)
    with TestClient(create_app(db_url, token=TOKEN)) as c:
        reg = _alert_regressions(c, 1)[0]
        answer = _post(c, f"/api/regressions/{reg['id']}", {"state": "acknowledged", "by": "pg"})
        assert answer.status_code == 200
        again = c.get(f"/api/regressions/{reg['id']}").json()["regression"]
        assert again["state"] == "acknowledged" and again["events"][-1]["by"] == "pg"


# -- many people at once, through the real server ----------------------------------------

CLIENTS = 20


def _lifecycle_held(events: list[dict]) -> None:
    """Each event starts where the one before ended, and moves only along TRANSITIONS (or
    keeps the state: a note, an assignee)."""
    for before, event in itertools.pairwise(events):
        assert event["from_state"] == before["to_state"], (before, event)
        moved = event["to_state"] != event["from_state"]
        assert not moved or event["to_state"] in TRANSITIONS[event["from_state"]], event


def _concurrently(count: int, work) -> list:
    """``work(n)`` in ``count`` threads released together."""
    start = threading.Barrier(count)

    def run(n):
        start.wait(timeout=60)
        return work(n)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def test_twenty_clients_triaging_one_regression_at_once(db_url, tmp_path):
    """Before the row lock, PostgreSQL accepted both of two conflicting moves sent at once and
    stored moves the lifecycle forbids (``invalid -> fixed``) with false ``from`` states."""
    _fill(db_url)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    with running_server(db_url, "--token-file", str(token_file)) as base:
        with urllib.request.urlopen(base + "/api/alerts/1", timeout=30) as response:
            reg_id = json.loads(response.read())["alert"]["regressions"][0]["id"]
        url = f"{base}/api/regressions/{reg_id}"
        # Two conflicting moves at once (neither invalid nor fixed can become the other):
        # exactly one is accepted, round after round.
        for round_ in range(8):
            moves = [{"state": "invalid", "note": f"r{round_}"}, {"state": "fixed", "note": "x"}]
            answers = _concurrently(2, lambda n, moves=moves: _urlopen(url, moves[n], headers)[0])
            assert sorted(answers) == [200, 400], (round_, answers)
            assert _urlopen(url, {"state": "detected"}, headers)[0] == 200

        def client(n: int) -> list[int]:  # five moves each, any state, each with a note
            rng = random.Random(n)
            return [
                _urlopen(url, {"state": rng.choice(list(TRANSITIONS)), "note": f"{n}.{step}",
                               "by": f"client-{n}"}, headers)[0]
                for step in range(5)
            ]  # fmt: skip

        statuses = [s for answers in _concurrently(CLIENTS, client) for s in answers]
        with urllib.request.urlopen(url, timeout=30) as response:
            after = json.loads(response.read())["regression"]
    assert set(statuses) <= {200, 400}, statuses
    events = after["events"]
    _lifecycle_held(events)
    assert after["state"] == events[-1]["to_state"]
    # Every accepted move is one event, every refused one none.
    by_clients = [e for e in events if e["by"].startswith("client-")]
    assert len(by_clients) == statuses.count(200) >= 1


# -- the real server -----------------------------------------------------------------------


def _urlopen(url: str, body: dict, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def token_server(db_copy, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")  # whitespace around it is stripped
    with running_server(db_copy, "--token-file", str(token_file)) as base:
        yield base


def test_done_when_serve_with_a_token_accepts_the_post_and_403s_without_the_header(token_server):
    with urllib.request.urlopen(token_server + "/api/alerts/1", timeout=30) as response:
        reg_id = json.loads(response.read())["alert"]["regressions"][0]["id"]
    url = f"{token_server}/api/regressions/{reg_id}"
    body = {"state": "acknowledged"}
    status, text = _urlopen(url, body, {"Content-Type": "application/json"})
    assert status == 403, text
    status, text = _urlopen(
        url, body, {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 200, text
    assert json.loads(text)["regressions"][0]["state"] == "acknowledged"


# -- in Chromium ---------------------------------------------------------------------------


@pytest.mark.browser
def test_read_then_acknowledge_through_the_form(token_server, open_url):
    with urllib.request.urlopen(token_server + "/api/alerts/1", timeout=30) as response:
        reg = json.loads(response.read())["alert"]["regressions"][0]
    url = f"{token_server}/regressions/{reg['id']}"
    opened = open_url(url)
    page = opened.page
    # Read without a token: everything shows; the token field is empty.
    assert page.inner_text(f'h1 [data-state-of="{reg["id"]}"]') == "detected"
    assert page.input_value("#triage-token") == ""
    assert page.locator('#triage button[value="acknowledged"]').is_visible()
    assert page.locator('#triage button[value="detected"]').is_hidden()  # already detected
    opened.assert_clean()
    # A wrong token: refused, nothing changes.
    page.fill("#triage-token", "guess")
    page.click('#triage button[value="acknowledged"]')
    page.wait_for_selector("#triage-status.bad")
    assert "403" in page.inner_text("#triage-status") and "wrong token" in page.inner_text(
        "#triage-status"
    )
    # Ignore without a reason: the lifecycle's message.
    page.fill("#triage-token", TOKEN)
    page.click('#triage button[value="ignored"]')
    page.wait_for_selector('#triage-status.bad:has-text("say why it is ignored")')
    # The right token and a name: acknowledged, and the event is on the page.
    page.fill('[data-field="by"]', "Ana")
    page.fill('[data-field="note"]', "tile halo, PR 31")
    page.click('#triage button[value="acknowledged"]')
    page.wait_for_selector("#triage-status.ok")
    assert page.inner_text(f'h1 [data-state-of="{reg["id"]}"]') == "acknowledged"
    rows = page.locator(f'tbody[data-events-of="{reg["id"]}"] tr')
    assert rows.count() == 2
    last = rows.nth(1).inner_text()
    assert "Ana" in last and "acknowledged" in last and "tile halo, PR 31" in last
    assert page.locator('#triage button[value="acknowledged"]').is_hidden()
    assert page.locator('#triage button[value="detected"]').is_visible()  # reopen
    # The browser logs each refused request (403, then 400), and nothing else.
    refused = [m for m in opened.console if "Failed to load resource" in m]
    assert [m for m in opened.console if m not in refused] == [] and opened.dialogs == []
    assert ["403" in refused[0], "400" in refused[1]] == [True, True]
    posts = [r for r in opened.requests if r != url]
    assert posts == [f"{token_server}/api/regressions/{reg['id']}"] * 3
    # Reloaded: the server says the same, and the tab still holds the token (never the HTML).
    page.reload()
    assert page.inner_text(f'h1 [data-state-of="{reg["id"]}"]') == "acknowledged"
    assert page.input_value("#triage-token") == TOKEN
    assert TOKEN not in page.content()
    assert page.evaluate("document.cookie") == ""


@pytest.mark.browser
def test_acknowledge_a_whole_alert_in_chromium(token_server, open_url):
    opened = open_url(token_server + "/alerts/1")
    page = opened.page
    page.fill("#triage-token", TOKEN)
    page.click('#triage button[value="acknowledged"]')
    page.wait_for_selector("#triage-status.ok")
    states = page.eval_on_selector_all(
        "#alert-cases [data-state-of]", "nodes => nodes.map(n => n.textContent)"
    )
    assert states and set(states) == {"acknowledged"}
    with urllib.request.urlopen(token_server + "/api/alerts/1", timeout=30) as response:
        regs = json.loads(response.read())["alert"]["regressions"]
    assert {r["state"] for r in regs} == {"acknowledged"}
    for r in regs:
        rows = page.locator(f'tbody[data-events-of="{r["id"]}"] tr')
        assert rows.count() == len(r["events"]) == 2
    assert opened.console == []


@pytest.mark.browser
def test_anchors_state_in_the_address_and_the_compare_picker(token_server, open_url):
    case_id = FIRST[0]
    opened = open_url(f"{token_server}/runs/2#case-{case_id}")
    page = opened.page
    assert page.evaluate("document.querySelector(':target').id") == f"case-{case_id}"
    # The filter goes into the address, after the anchor, and comes back on reload.
    page.fill('input[data-target="failure-list"]', "crashed")
    assert page.evaluate("location.hash") == f"#case-{case_id}&filter.failure-list=crashed"
    visible = page.locator("#failure-list details:visible").count()
    assert visible == 1
    page.reload()
    assert page.input_value('input[data-target="failure-list"]') == "crashed"
    assert page.locator("#failure-list details:visible").count() == visible
    # A sort too.
    table = 'table[data-pivot="seqlen"]'
    page.click(f"{table} thead th:nth-child(2)")
    page.click(f"{table} thead th:nth-child(2)")  # descending
    assert re.search(r"&sort\.t\d+=1d(&|$)", page.evaluate("location.hash"))
    first = page.locator(f"{table} tbody tr").first.get_attribute("data-key")
    page.reload()
    assert page.locator(f"{table} tbody tr").first.get_attribute("data-key") == first
    assert page.locator(f"{table} thead th:nth-child(2)").get_attribute("data-dir") == "desc"
    # A failure links to its case page and its regressions.
    page.fill('input[data-target="failure-list"]', "")
    assert f"#case-{case_id}&sort.t" in page.evaluate("location.hash")
    page.click(f'details#case-{case_id} a[href="/cases/{case_id}"]')
    page.wait_for_url(f"**/cases/{case_id}")
    assert opened.console == []
    # The compare picker on the runs index.
    opened = open_url(token_server + "/")
    opened.page.select_option("#compare-base", "1")
    opened.page.select_option("#compare-head", "3")
    with opened.page.expect_navigation():
        opened.page.click("#compare button")
    assert opened.page.url.endswith("/diff/1/3")
    assert opened.page.inner_text("#verdict") == "REGRESSED"
    # The diff's rows link to the runs' anchors.
    opened.page.click(f'#new_failures a[href="/runs/3#case-{LATER}"]')
    opened.page.wait_for_url(f"**/runs/3#case-{LATER}")
    assert opened.page.evaluate("document.querySelector(':target').id") == f"case-{LATER}"
    assert opened.console == []


@pytest.mark.browser
def test_static_reports_keep_filter_state_on_disk(database, open_url):
    path = (database / "run-2.html").as_uri()
    opened = open_url(path)
    page = opened.page
    page.fill('input[data-target="failure-list"]', "crashed")
    assert page.evaluate("location.hash") == "#filter.failure-list=crashed"
    page.reload()
    assert page.input_value('input[data-target="failure-list"]') == "crashed"
    assert page.locator("#failure-list details:visible").count() == 1
    assert opened.console == [] and all(r.startswith("file://") for r in opened.requests)
    assert Path(database / "run-2.html").exists()
