"""``convmatrix serve``: every page and its JSON through Starlette's TestClient, then the real
server (``convmatrix serve`` in a subprocess on a free 127.0.0.1 port) in headless Chromium:
the numbers on each page are those of its JSON, no console error, no request but the page's.

The JSON of a run, a diff and a history is compared with what the static reports write beside
their HTML (``convmatrix report``/``diff``/``history``): one view-model for both.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_browser
from reports_support import cases, synthetic_results, write_run

from convmatrix.cli import main
from convmatrix.db import make_engine, open_database
from convmatrix.db.engine import write_session
from convmatrix.db.migrate import upgrade
from convmatrix.reports.formatting import fmt_num
from convmatrix.service.scan import scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

browser = test_browser.browser  # the Chromium fixtures of the static reports' browser tests
open_url = test_browser.open_url
BROKEN = {c.id for c in cases(60)[:2]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A database with three runs (good, broken, broken again) scanned for regressions, and
    the static reports of them written by the CLI. Returns (url, report directory)."""
    out = tmp_path_factory.mktemp("serve")
    url = f"sqlite:///{out / 'results.db'}"
    engine = open_database(url)
    write_run(engine, synthetic_results(60, timed_every=3), commit="1" * 40, label="nightly-1")
    bug = lambda c: c.id in BROKEN  # noqa: E731
    for n in (2, 3):
        run = write_run(engine, synthetic_results(60, bug=bug, timed_every=3), commit=str(n) * 40)
        with write_session(engine) as session:
            scan_run(session, run)
    engine.dispose()
    assert main(["report", "2", "--db", url, "--out", str(out)]) == 1
    assert main(["diff", "1", "2", "--db", url, "--out", str(out / "diff.html")]) == 0
    history = ["history", "--dtype", "float32", "--format", "html", "--db", url]
    assert main([*history, "--out", str(out / "history.html")]) == 0
    return url, out


@pytest.fixture(scope="module")
def client(served):
    with TestClient(create_app(served[0])) as c:
        yield c


def test_the_json_of_each_page_is_the_static_reports_view_model(client, served):
    _, out = served
    for api, static in (
        ("/api/runs/2", "run-2.json"),
        ("/api/diff/1/2", "diff.json"),
        ("/api/history/float32", "history.json"),
    ):
        response = client.get(api)
        assert response.status_code == 200, api
        assert response.json() == json.loads((out / static).read_text()), api


@pytest.mark.parametrize("spelling", ["bf16", "BF16", "bfloat16", "f32"])
def test_the_served_history_reads_dtypes_as_the_command_line_does(client, served, capsys, spelling):
    # One loader for both doors: any spelling the CLI takes shows the same runs and points.
    url, _ = served
    assert main(["history", "--dtype", spelling, "--format", "json", "--db", url]) == 0
    printed = json.loads(capsys.readouterr().out)
    response = client.get(f"/api/history/{spelling}")
    assert response.status_code == 200
    assert response.json() == printed
    assert printed["dtype"] in ("bfloat16", "float32")
    assert len(printed["runs"]) == 3  # every run of the fixture holds cases of both dtypes


def test_the_served_history_filters_by_kernel_and_matrix(client):
    """The served history offers the kernels and matrices the database holds and keeps one."""
    page = client.get("/history/float32?kernel=tiled&matrix=nightly")
    assert page.status_code == 200
    assert '<form id="history-filters"' in page.text
    assert '<option value="nightly" selected>nightly</option>' in page.text
    assert len(client.get("/api/history/float32?matrix=nightly").json()["runs"]) == 3
    assert client.get("/api/history/float32?matrix=smoke").json()["runs"] == []


def test_every_page_renders_with_its_policy_and_links(client):
    case_id = sorted(BROKEN)[0]
    for path in ("/", "/runs/latest", "/runs/nightly-1", "/diff/1/3", "/history/bfloat16",
                 f"/cases/{case_id}", f"/cases/{case_id[:6]}", "/regressions", "/alerts/1",
                 "/regressions/1"):  # fmt: skip
        page = client.get(path)
        assert page.status_code == 200, path
        assert "form-action 'self'" in page.headers["content-security-policy"]
        assert f'href="/api{path}"' in page.text  # the page's own JSON
        assert client.get("/api" + path).status_code == 200, path


def test_the_runs_index_filters(client):
    every = client.get("/api/").json()
    assert [r["id"] for r in every["runs"]] == [3, 2, 1]  # newest first
    assert every["choices"]["label"] == ["nightly-1"]
    assert [r["id"] for r in client.get("/api/?label=nightly-1").json()["runs"]] == [1]
    assert (
        client.get("/api/?kernel=tiled&device=cpu&matrix=nightly").json()["runs"] == every["runs"]
    )
    assert client.get("/api/?kernel=other").json()["runs"] == []
    assert client.get("/api/?until=2000-01-01").json()["runs"] == []
    assert len(client.get("/api/?since=1d").json()["runs"]) == 3
    assert [r["counts"]["failed"] for r in every["runs"]] == [2, 2, 0]
    assert [r["counts"]["crashed"] for r in every["runs"]] == [1, 1, 1]  # the extras' crash


def test_a_case_history_and_the_regressions(client):
    case_id = sorted(BROKEN)[0]
    case = client.get(f"/api/cases/{case_id}").json()
    assert [r["run_id"] for r in case["runs"]] == [1, 2, 3]
    assert [r["outcome"] for r in case["runs"]] == ["passed", "failed", "failed"]
    assert case["rerun"].endswith(f"--case {case_id}") and "--kernel tiled" in case["rerun"]
    kinds = {r["kind"] for r in case["regressions"]}
    assert kinds == {"new_failure"}  # one regression per case: its outputs are inside it
    alerts = client.get("/api/regressions?state=detected").json()["alerts"]
    assert len(alerts) == 1  # run 3 failed the same cases: known, no second alert
    regs = alerts[0]["regressions"]
    assert {r["case_id"] for r in regs} == BROKEN
    assert {(r["case_id"], r["kind"]) for r in regs} == {(c, "new_failure") for c in BROKEN}
    assert all(r["first_bad_run"] == 2 for r in regs)
    assert client.get("/api/regressions?state=fixed").json()["alerts"] == []


def test_unknown_names_are_404_with_the_command_lines_message(client):
    missing = client.get("/runs/99")
    assert (
        missing.status_code == 404 and "matches no run id, label or kernel commit" in missing.text
    )
    assert client.get("/cases/ffffffffffff").status_code == 404
    # a state that does not exist is malformed input, not a name matching nothing
    assert client.get("/regressions?state=lost").status_code == 400
    for path in ("/alerts/99", "/regressions/99", "/alerts/one", "/api/alerts/99"):
        missing = client.get(path)
        assert missing.status_code == 404, path
        assert missing.text.startswith("convmatrix serve: "), path


def test_a_server_without_a_token_refuses_every_write(client, server):
    # TestClient and the real `convmatrix serve` (no --token-file, no CONVMATRIX_SERVE_TOKEN).
    body = json.dumps({"state": "acknowledged"}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer anything"}
    for path in ("/api/regressions/1", "/api/alerts/1"):
        answer = client.post(path, content=body, headers=headers)
        assert answer.status_code == 403, path
        assert "read-only" in answer.text and "--token-file" in answer.text
        request = urllib.request.Request(server + path, data=body, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 403, path
    assert client.get("/api/regressions/1").json()["regression"]["state"] == "detected"


def test_serve_refuses_a_missing_or_outdated_database(tmp_path, capsys):
    assert main(["serve", "--db", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    upgrade(engine, "0001")  # a database an older convmatrix wrote
    engine.dispose()
    assert main(["serve", "--db", url]) == 2
    assert "run `convmatrix db upgrade --db URL` first" in capsys.readouterr().err


# -- the real server in a real browser -----------------------------------------------------


@contextmanager
def running_server(url: str, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``convmatrix serve --db URL --port 0 ARGS...`` in a subprocess; yields its base URL once
    it answers, stops it on exit. The server binds port 0 itself and prints the port it got
    on its first line: no port picked here first that another process could take meanwhile."""
    root = Path(__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items() if k != "CONVMATRIX_SERVE_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "convmatrix", "serve", "--db", url, "--port", "0", *args],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**environ, **(env or {})},
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def drain() -> None:  # every line kept, so a full pipe never stops the server
        for line in proc.stdout:
            output.append(line)
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        first = lines.get(timeout=120)
    except queue.Empty:
        first = ""
    found = re.match(r"convmatrix serve: (http://127\.0\.0\.1:\d+)/", first)
    if found is None:
        proc.kill()
        proc.wait(timeout=30)
        pytest.fail(f"convmatrix serve did not start: {''.join(output)}")
    base = found.group(1)
    try:
        _wait_until_it_answers(proc, base, output)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_until_it_answers(proc: subprocess.Popen, base: str, output: list[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(base + "/api/regressions", timeout=5).read()
            return
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"convmatrix serve did not answer: {''.join(output)}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server(served):
    with running_server(served[0]) as base:
        yield base


def _json(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + "/api" + path, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.browser
def test_the_served_pages_in_chromium(server, open_url):
    index = _json(server, "/")
    opened = open_url(server + "/")
    page = opened.page
    assert page.inner_text('[data-count="runs"]') == str(len(index["runs"]))
    rows = page.locator("#run-rows tr")
    assert rows.count() == len(index["runs"])
    for i, run in enumerate(index["runs"]):
        assert rows.nth(i).get_attribute("data-run-id") == str(run["id"])
        failed = rows.nth(i).locator('td[data-outcome="failed"]').inner_text()
        assert failed == str(run["counts"]["failed"])
    opened.assert_clean()
    # The filter form: choose a label, submit, land on the filtered index.
    page.select_option('select[name="label"]', "nightly-1")
    with page.expect_navigation():
        page.click("#run-filters button")
    assert "label=nightly-1" in page.url
    assert page.locator("#run-rows tr").count() == 1
    assert opened.console == []
    # A run page, followed from the index: its verdict and counts as in its JSON.
    run = _json(server, "/runs/2")
    opened = open_url(server + "/runs/2")
    assert opened.page.inner_text("#verdict") == "FAILED"
    assert run["run"]["counts"]["failed"] == len(BROKEN)
    for outcome, n in run["run"]["counts"].items():
        if n:
            assert opened.page.inner_text(f'header [data-count="{outcome}"]') == str(n)
    opened.assert_clean()


@pytest.mark.browser
def test_case_history_diff_and_regressions_in_chromium(server, open_url):
    case_id = sorted(BROKEN)[0]
    case = _json(server, f"/cases/{case_id}")
    opened = open_url(f"{server}/cases/{case_id}")
    page = opened.page
    assert page.inner_text("#rerun") == case["rerun"]
    for r in case["runs"]:
        row = page.locator(f'#case-runs tr[data-run-id="{r["run_id"]}"]')
        cells = row.locator("td.num")
        for j, output in enumerate(case["outputs"]):  # per output: its usage, then its e_rel
            assert cells.nth(2 * j + 1).inner_text() == fmt_num(r["usage"].get(output))
            assert cells.nth(2 * j + 2).inner_text() == fmt_num(r["e_rel"].get(output))
    opened.assert_clean()
    diff = _json(server, "/diff/1/2")
    opened = open_url(server + "/diff/1/2")
    assert opened.page.inner_text('[data-count="new_failures"]') == str(len(diff["new_failures"]))
    opened.assert_clean()
    history = _json(server, "/history/float32")
    opened = open_url(server + "/history/float32")
    assert opened.page.inner_text('[data-count="runs"]') == str(len(history["runs"])) == "3"
    rows = opened.page.locator("#history-rows tr")
    assert rows.count() == sum(len(r["outputs"]) for r in history["runs"])
    opened.assert_clean()
    alerts = _json(server, "/regressions")
    opened = open_url(server + "/regressions")
    assert opened.page.locator("#alert-rows tr").count() == len(alerts["alerts"]) == 1
    assert opened.page.inner_text('[data-count="detected"]') == str(alerts["counts"]["detected"])
    alert_id = alerts["alerts"][0]["id"]
    opened.page.click(f'#alert-rows a[href="/alerts/{alert_id}"]')
    opened.page.wait_for_url(f"**/alerts/{alert_id}")
    # No token on this server: the alert reads, and says how to triage instead of a form.
    assert "read-only: start serve with --token-file to triage" in opened.page.inner_text("main")
    assert opened.page.locator("form.triage").count() == 0
    opened.page.click(f'#alert-cases a[href="/cases/{case_id}"] >> nth=0')
    opened.page.wait_for_url(f"**/cases/{case_id}")
    assert opened.console == []


def test_the_case_page_shows_usage_per_output_per_run_beside_e_rel(tmp_path):
    """Runs judged by bound usage: the served case page gives each run's usage per output
    (the stored doubles) and what it was allowed, before e_rel, in its JSON and its HTML."""
    from convmatrix.reports.render import render_html
    from convmatrix.service.pages import case_page

    url = f"sqlite:///{tmp_path / 'usage.db'}"
    engine = open_database(url)
    bug = lambda c: c.id in BROKEN  # noqa: E731
    runs = [synthetic_results(60, usage=True), synthetic_results(60, bug=bug, usage=True)]
    for n, results in enumerate(runs, 1):
        write_run(engine, results, commit=str(n) * 40)
    case_id = sorted(BROKEN)[0]
    with write_session(engine) as session:
        view = case_page(session, url, case_id)
    engine.dispose()
    for run, results in zip(view.runs, runs, strict=True):
        result = next(r for r in results if r.case.id == case_id)
        assert run.usage == {m.output: m.bound_usage for m in result.outputs}
        assert run.usage_limit == dict.fromkeys(run.usage, 2.0)
        assert run.broken_zeros == dict.fromkeys(run.usage, 0)
    assert max(view.runs[1].usage.values()) > 2 >= max(view.runs[0].usage.values())
    html = render_html(view)
    output = view.outputs[0]
    usage = view.runs[1].usage[output]
    assert f'data-output="{output}" data-usage="{usage!r}">{fmt_num(usage)}</td>' in html
    assert f"<th>{output} usage</th><th>{output} e_rel</th>" in html
