"""Triage through ``convmatrix serve``: the alerts index, the alert and regression pages and
their JSON, the links and anchors between run, diff and case pages, and in headless Chromium
through the real server: anchors, the sort and filter state in the address (served and on
disk), the compare picker.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import pytest
import test_browser
from reports_support import cases, synthetic_results, write_run
from test_serve import running_server

from convmatrix.cli import main
from convmatrix.core.records import PropertyResult
from convmatrix.db import open_database
from convmatrix.db.engine import write_session
from convmatrix.service.scan import scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

browser = test_browser.browser
open_url = test_browser.open_url

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


@pytest.fixture(scope="module")
def reader(database):
    """A client of the module's database."""
    with TestClient(create_app(f"sqlite:///{database / 'results.db'}")) as c:
        yield c


def _alert_regressions(client, alert_id):
    return client.get(f"/api/alerts/{alert_id}").json()["alert"]["regressions"]


# -- reading -------------------------------------------------------------------------------


def test_the_alerts_index_newest_first_and_filtered(reader):
    index = reader.get("/api/regressions").json()
    assert index["kind"] == "alerts"
    assert [a["id"] for a in index["alerts"]] == [2, 1]
    assert {r["case_id"] for r in index["alerts"][1]["regressions"]} == set(FIRST)
    assert {r["case_id"] for r in index["alerts"][0]["regressions"]} == {LATER}
    assert index["counts"] == {"detected": 6}  # 3 cases x (new failure, error regression)
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
    assert {(r["case_id"], r["kind"]) for r in regs} == {
        (c, k) for c in FIRST for k in ("new_failure", "error_regression")
    }
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


# -- in Chromium ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(database):
    with running_server(f"sqlite:///{database / 'results.db'}") as base:
        yield base


@pytest.mark.browser
def test_anchors_state_in_the_address_and_the_compare_picker(server, open_url):
    case_id = FIRST[0]
    opened = open_url(f"{server}/runs/2#case-{case_id}")
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
    table = 'table[data-pivot="length class"]'
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
    opened = open_url(server + "/")
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
