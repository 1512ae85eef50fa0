"""The three reports in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Each page is written by the real CLI from a real SQLite database, opened from disk, and must
render the numbers of its JSON view-model, log no console error, make no request but the page
itself, run its sorting and filtering script, and show a kernel's ``<script>`` as text (no
dialog opens). Screenshots go to ``test-artifacts/`` for people to look at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from components import chromium_path, require
from playwright.sync_api import sync_playwright
from reports_support import XSS, synthetic_results, tile_plus_one_channel_last, write_run

from convmatrix.cli import main
from convmatrix.db import open_database
from convmatrix.reports.formatting import fmt_num, fmt_pct

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="module")
def browser():
    require("chromium")  # skipped without it locally, failed under CI
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Two runs (correct, seeded bug; timed cases, XSS messages) and the three reports of them,
    written by the CLI. Returns the output directory."""
    out = tmp_path_factory.mktemp("reports")
    url = f"sqlite:///{out / 'results.db'}"
    engine = open_database(url)
    write_run(engine, synthetic_results(300, timed_every=4), commit="1" * 40)
    write_run(
        engine,
        synthetic_results(300, bug=tile_plus_one_channel_last, timed_every=4, timing_scale=1.3),
        commit="2" * 40,
    )
    engine.dispose()
    assert main(["report", "2", "--db", url, "--out", str(out)]) == 1
    assert main(["diff", "1", "2", "--db", url, "--out", str(out / "diff.html")]) == 0
    assert main(["diff", "2", "2", "--db", url, "--out", str(out / "same.html")]) == 0
    history = ["history", "--dtype", "float32", "--format", "html", "--db", url]
    assert main([*history, "--out", str(out / "history.html")]) == 0
    return out


@dataclass
class Opened:
    page: object
    url: str
    console: list[str] = field(default_factory=list)  # errors and warnings
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.console == [], self.console
        assert self.dialogs == [], self.dialogs
        assert self.requests == [self.url], self.requests  # the page itself, nothing else


@pytest.fixture
def open_url(browser):
    """Open a URL in a fresh context, recording console messages, requests and dialogs
    (also used by tests/test_serve.py for the served pages)."""
    contexts = []

    def _open(url: str) -> Opened:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        opened = Opened(page=page, url=url)
        page.on("console", lambda m: m.type in ("error", "warning") and opened.console.append(
            f"{m.type}: {m.text}"))  # fmt: skip
        page.on("pageerror", lambda e: opened.console.append(f"pageerror: {e}"))
        page.on("request", lambda r: opened.requests.append(r.url))
        page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
        page.goto(opened.url, wait_until="load")
        return opened

    yield _open
    for context in contexts:
        context.close()


@pytest.fixture
def open_page(open_url):
    return lambda path: open_url(path.as_uri())


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _values(page, selector: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(
        selector, "cells => cells.map(c => c.getAttribute('data-value'))")]  # fmt: skip


def test_run_report(open_page, reports):
    data = json.loads((reports / "run-2.json").read_text())
    opened = open_page(reports / "run-2.html")
    page = opened.page
    assert page.inner_text("#verdict") == "FAILED"
    for outcome, n in data["run"]["counts"].items():
        if n:
            assert page.inner_text(f'header [data-count="{outcome}"]') == str(n)
    where = data["where"][0]
    first = page.locator("#hotspots li").first
    assert first.get_attribute("data-key") == ", ".join(where["values"])
    assert where["values"][0] in page.inner_text("#hotspots")  # the seeded bug's pair
    # The seeded bug's corner of the length x layout pivot: 0% and O(1) errors, as in the JSON.
    pivot = next(p for p in data["pivots"] if p["dims"] == ["seqlen", "layout"])
    row_data = next(r for r in pivot["rows"] if r["key"] == ["tile+1", "channel_last"])
    row = page.locator('table[data-pivot="seqlen x layout"] tr[data-key="tile+1 / channel_last"]')
    assert row.locator("td.rate-low").inner_text() == fmt_pct(row_data["pass_rate"]) == "0.0%"
    for output, value in row_data["worst_rel"].items():
        cell = row.locator(f'td[data-output="{output}"]')
        assert cell.inner_text() == fmt_num(value)
        assert float(cell.get_attribute("data-value")) == value  # repr round-trips exactly
    # Failures: the first one's outputs as in the JSON.
    first = data["failures"][0]
    block = page.locator(f'#failure-list details[data-case-id="{first["case_id"]}"]')
    for o in first["outputs"]:
        cells = block.locator(f'tr[data-output="{o["output"]}"] td.num')
        assert cells.nth(1).inner_text() == fmt_num(o["e_rel"])
    assert first["rerun"] in page.inner_text("#failures")
    # A kernel's message with a script element is shown as text, and no dialog opened.
    assert XSS in page.inner_text("#expected-errors")
    assert XSS in page.inner_text("#failures")
    # The inline script runs (the CSP allows it by hash): sorting and filtering work.
    table = 'table[data-pivot="seqlen"]'
    page.click(f"{table} thead th:nth-child(2)")
    cases = _values(page, f"{table} tbody td:nth-child(2)")
    assert cases == sorted(cases)
    page.click(f"{table} thead th:nth-child(2)")
    assert _values(page, f"{table} tbody td:nth-child(2)") == sorted(cases, reverse=True)
    page.fill('input[data-target="failure-list"]', "crashed")
    visible = page.locator("#failure-list details:visible")
    assert visible.count() == sum(f["outcome"] == "crashed" for f in data["failures"]) == 1
    page.fill('input[data-target="failure-list"]', "")
    assert page.locator("#failure-list details:visible").count() == len(data["failures"])
    _shot(page, "run-report.png")
    opened.assert_clean()


def test_diff_report(open_page, reports):
    data = json.loads((reports / "diff.json").read_text())
    opened = open_page(reports / "diff.html")
    page = opened.page
    assert page.inner_text("#verdict") == "REGRESSED"
    for section in ("new_failures", "fixed", "still_failing", "added", "removed"):
        assert page.inner_text(f'header [data-count="{section}"]') == str(len(data[section]))
        assert page.locator(f"#{section} tbody tr").count() == len(data[section])
    assert data["new_failures"]
    shown = page.eval_on_selector_all(
        "#new_failures tbody tr", "rows => rows.map(r => r.getAttribute('data-case-id'))"
    )
    assert sorted(shown) == sorted(c["case_id"] for c in data["new_failures"])
    top = data["error_regressions"][0]
    cells = page.locator("#error_regressions tbody tr").first.locator("td.num")
    # usage before and after, growth, floor, zeros broken; then e_rel and e_norm beside them
    keys = ("base_usage", "head_usage", "growth", "floor", None, "base_rel", "head_rel",
            "base_norm", "head_norm")  # fmt: skip
    for i, k in enumerate(keys):
        if k is not None:
            assert cells.nth(i).inner_text() == fmt_num(top[k]), k
    n_slower = len(data["timing"]["regressions"])
    assert n_slower > 0
    assert page.inner_text('header [data-count="timing_regressions"]') == str(n_slower)
    assert XSS in page.inner_text("#still_failing")
    _shot(page, "diff-report.png")
    opened.assert_clean()


def test_diff_of_a_run_with_itself(open_page, reports):
    opened = open_page(reports / "same.html")
    assert opened.page.inner_text("#verdict") == "NO CHANGES"
    assert opened.page.inner_text('header [data-count="new_failures"]') == "0"
    opened.assert_clean()


def test_history_report(open_page, reports):
    data = json.loads((reports / "history.json").read_text())
    opened = open_page(reports / "history.html")
    page = opened.page
    runs, outputs = data["runs"], data["outputs"]
    assert len(runs) == 2 and [r["failing"] for r in runs] == [False, True]
    assert page.locator("svg.chart").count() == len(outputs) + 1
    # One point per run and series (4 error series per output chart, 1 pass-rate series).
    assert page.locator("svg.chart circle").count() == len(runs) * (4 * len(outputs) + 1)
    assert page.locator("svg.chart rect.mark").count() == len(outputs) + 1  # the failing run
    tips = page.eval_on_selector_all("svg.chart g title", "ts => ts.map(t => t.textContent)")
    # A point's tip names its run and the kernel at its commit (8 hex digits, as git's short form).
    head = runs[1]
    assert any(t.startswith(f"run {head['run_id']}: {head['kernel']}@{'2' * 8} (") for t in tips)
    for run in runs:
        for output, stats in run["outputs"].items():
            row = page.locator(f'tr[data-run-id="{run["run_id"]}"][data-output="{output}"]')
            cells = row.locator("td.num")
            texts = [cells.nth(i).inner_text() for i in range(cells.count())]
            assert fmt_num(stats["worst_rel"]) in texts and fmt_num(stats["median_norm"]) in texts
    _shot(page, "history-report.png")
    opened.assert_clean()
