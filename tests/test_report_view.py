"""The run report's view-model and rendering, from real ``CaseResult`` records.

The database round trip is covered in test_report_cli.py; here the records go straight into the
builders, so each test states exactly which cases it expects where.
"""

from __future__ import annotations

import base64
import hashlib
import html as html_lib
import json
import math
import re

import pytest
from reports_support import GEOMETRY, XSS, synthetic_results, tile_plus_one_channel_last

from convmatrix.core.case import Case
from convmatrix.core.records import BAD_OUTCOMES, OutputMetrics
from convmatrix.core.verdict import output_severity as severity
from convmatrix.core.verdict import worst
from convmatrix.reports.dimensions import length_class, length_order
from convmatrix.reports.formatting import fmt_num
from convmatrix.reports.render import render_html, write_report
from convmatrix.reports.run_view import build_run_view
from convmatrix.reports.viewmodel import RunHeader, to_jsonable


def header(**overrides) -> RunHeader:
    data = dict(
        id=7, kernel="tiled", commit="c0ffee" * 6, dirty=False, device="cpu", host="ci",
        matrix="nightly", matrix_hash="f" * 64, label=None, started_at="2025-01-01T00:00:00",
        finished_at=None, status="finished", versions={"torch": "2.13.0"}, geometry=GEOMETRY,
        database="sqlite:///results.db",
    )  # fmt: skip
    data.update(overrides)
    return RunHeader(**data)


@pytest.fixture(scope="module")
def results():
    return synthetic_results(400, bug=tile_plus_one_channel_last)


@pytest.fixture(scope="module")
def view(results):
    return build_run_view(header(), results)


@pytest.mark.parametrize(
    ("seqlen", "expected"),
    [
        (1, "1"), (3, "K-1"), (4, "K"), (5, "K+1"), (40, "(K+1, tile-1)"), (63, "tile-1"),
        (64, "tile"), (65, "tile+1"), (127, "2*tile-1"), (128, "2*tile"), (129, "2*tile+1"),
        (100, "> tile (off boundary)"),
    ],
)  # fmt: skip
def test_length_class_names_lengths_by_their_relation_to_k_and_the_tile(seqlen, expected):
    case = Case(suite="t", op="fwd", width=4, dim=8, batch=1, seqlen=seqlen)
    assert length_class(case, GEOMETRY) == expected


def test_length_classes_sort_by_length_and_without_a_tile_fall_back_to_k():
    labels = ["tile+1", "2*tile", "1", "tile", "K-1", "2*tile-1", "(K+1, tile-1)", "K"]
    assert sorted(labels, key=length_order) == [
        "1", "K-1", "K", "(K+1, tile-1)", "tile", "tile+1", "2*tile-1", "2*tile",
    ]  # fmt: skip
    case = Case(suite="t", op="fwd", width=4, dim=8, batch=1, seqlen=65)
    assert length_class(case, None) == ">= 2K"


def test_pivot_singles_out_the_seeded_bug(view, results):
    """Only (tile+1, channel_last) fails, every case of it; the other bad row is the one
    crashed extra case (length 16 of K=5: between K+1 and the tile)."""
    pivot = next(p for p in view.pivots if p.dims == ["seqlen", "layout"])
    bad_rows = {tuple(r.key): r for r in pivot.rows if r.n_bad}
    assert set(bad_rows) == {("tile+1", "channel_last"), ("(K+1, tile-1)", "channel_first")}
    assert bad_rows[("(K+1, tile-1)", "channel_first")].n_bad == 1
    buggy = [r for r in results if r.case.expect == "ok" and tile_plus_one_channel_last(r.case)]
    row = bad_rows[("tile+1", "channel_last")]
    assert len(buggy) > 0 and row.n_bad == row.n == len(buggy)
    assert row.pass_rate == 0.0
    others = [r for r in pivot.rows if tuple(r.key) not in bad_rows and r.n_passed]
    assert others and all(r.pass_rate == 1.0 for r in others)


def test_where_it_fails_names_the_seeded_bug(view, results):
    # The bug needs both dimensions: the explanation is the pair, exactly its cases.
    first = view.where[0]
    assert set(first.dimensions) == {"seqlen", "layout"}
    named = [dict(zip(first.dimensions, v.split(" / "), strict=True)) for v in first.values]
    assert {"seqlen": "tile+1", "layout": "channel_last"} in named
    buggy = [r for r in results if r.case.expect == "ok" and tile_plus_one_channel_last(r.case)]
    failing = [r for r in results if r.outcome in BAD_OUTCOMES]
    assert first.failing_in == first.failing == len(failing)
    # The fixture's extra failures (a crash, an error) fall in groups of their own, each of
    # which may hold a passing case; the seeded bug's group holds none.
    assert first.passing_in <= len(failing) - len(buggy)
    scores = [e.score for e in view.where]
    assert scores == sorted(scores, reverse=True)


def test_pivot_worst_error_is_the_maximum_over_the_group(view, results):
    pivot = next(p for p in view.pivots if p.dims == ["K", "dtype"])
    for row in pivot.rows:
        k, dtype = row.key
        members = [
            r for r in results
            if r.case.expect == "ok" and f"K={r.case.width}" == k
            and {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[r.case.x_dtype] == dtype
        ]  # fmt: skip
        for output, value in row.worst_rel.items():
            # Exact: the pivot takes the max of the same stored doubles.
            assert value == max(m.e_rel for r in members for m in r.outputs if m.output == output)


def test_failures_come_first_with_failing_outputs_and_a_rerun_command(view, results):
    bad = {r.case.id for r in results if r.outcome not in ("passed", "skipped")}
    assert {f.case_id for f in view.failures} == bad
    assert view.failures[0].outcome == "crashed"  # crashes before numeric failures
    numeric = [f for f in view.failures if f.outcome == "failed"]
    severities = [f.severity for f in numeric]
    assert severities == sorted(severities, reverse=True)
    for f in numeric:
        assert not f.outputs[0].passed  # the failing outputs lead
        assert f.outputs[0].severity > 1
        assert f.rerun == (
            f"convmatrix run --matrix nightly --kernel tiled --device cpu --case {f.case_id}"
        )
        o = f.outputs[0]
        assert o.vs_fw_rel == pytest.approx(o.e_rel / o.fw_rel, rel=1e-15)  # one division


def test_expected_errors_and_skips_are_reported_apart(view, results):
    assert [e.message for e in view.expected_errors] == [f"ContractError: bad width {XSS}"]
    assert view.expected_errors[0].reason == "width 5 is not supported"
    assert view.skipped == {"kernel lacks feature 'packed'": 1}
    for pivot in view.pivots:  # expected-error cases never enter the numeric pivots
        assert sum(r.n for r in pivot.rows) == sum(1 for r in results if r.case.expect == "ok")


def test_nan_is_the_worst_error():
    assert math.isnan(worst([1.0, math.nan, 3.0]))
    assert worst([None, 2.0, 1.0]) == 2.0
    m = OutputMetrics("y", math.nan, math.nan, 1e-9, 1e-3, 1.0, limit_rel=1e-6, limit_norm=1e-7)
    assert math.isnan(severity(m))


def test_json_is_strict_and_keeps_non_finite_values_as_strings(tmp_path):
    data = to_jsonable({"a": math.nan, "b": [math.inf, 1.5]})
    assert data == {"a": "nan", "b": ["inf", 1.5]}
    json.dumps(data, allow_nan=False)


def test_html_escapes_kernel_text_and_carries_a_csp_for_its_only_script(view, tmp_path):
    html_path, json_path = write_report(view, tmp_path / "run.html")
    html = html_path.read_text()
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    csp = html_lib.unescape(re.search(r'Content-Security-Policy" content="([^"]*)"', html)[1])
    assert f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing to fetch
    data = json.loads(json_path.read_text())
    assert data["kind"] == "run" and data["run"]["id"] == 7
    assert len(data["failures"]) == len(view.failures)


def test_no_credentials_in_report(results):
    from convmatrix.reports.viewmodel import run_header

    class Row:  # the attributes run_header reads from the database's RunInfo
        id, kernel, kernel_commit, kernel_dirty, matrix, matrix_hash = 1, "k", None, None, "m", "0"
        device_kind, device_name, host, versions, label, geometry = "cpu", None, "h", {}, None, None
        started_at = finished_at = None
        status, n_planned = "finished", None

    head = run_header(Row(), "postgresql+psycopg://alice:s3cr3t@db.example/results", results)
    html = render_html(build_run_view(head, results))
    assert "s3cr3t" not in html and "alice:***@db.example" in html


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (math.nan, "NaN"), (math.inf, "inf"), (0.0, "0"), (1.5e-7, "1.50e-07"),
     (0.0123, "0.0123"), (2.0, "2")],
)  # fmt: skip
def test_number_format(value, text):
    assert fmt_num(value) == text


# -- one measure: bound usage -------------------------------------------------------------------
@pytest.fixture(scope="module")
def usage_results():
    return synthetic_results(400, bug=tile_plus_one_channel_last, usage=True)


def test_pivots_and_the_failure_header_speak_bound_usage(usage_results):
    view = build_run_view(header(), usage_results)
    pivot = next(p for p in view.pivots if p.dims == ["K", "dtype"])
    for row in pivot.rows:
        k, dtype = row.key
        members = [
            r for r in usage_results
            if r.case.expect == "ok" and f"K={r.case.width}" == k
            and {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[r.case.x_dtype] == dtype
        ]  # fmt: skip
        for output, value in row.worst_usage.items():
            # exact: the max of the same doubles
            assert value == max(m.bound_usage for r in members for m in r.outputs
                                if m.output == output)  # fmt: skip
    numeric = [f for f in view.failures if f.outcome == "failed"]
    assert numeric
    for f in numeric:
        result = next(r for r in usage_results if r.case.id == f.case_id)
        failing = [m for m in result.outputs if not m.passed]
        assert f.worst_usage == max(m.bound_usage for m in failing) > 2.0
        assert f.usage_limit == 2.0 and f.broken_zeros == 0
    html = render_html(view)
    first = numeric[0]
    summary = re.search(
        rf'data-case-id="{first.case_id}".*?<summary>(.*?)</summary>', html, flags=re.S
    )[1]
    assert "worst bound usage" in summary and "error/limit" not in summary
    assert f'data-usage="{first.worst_usage!r}"' in summary
    cells = re.findall(r'<td class="num [^"]*" data-output="(\w+)" data-value="[^"]*" '
                       r'data-measure="(\w+)"', html)  # fmt: skip
    assert cells and {m for _, m in cells} == {"usage"}  # every pivot cell shows the usage


def test_a_run_without_usage_keeps_e_rel_in_its_pivots(view):
    html = render_html(view)
    assert 'data-measure="e_rel"' in html and 'data-measure="usage"' not in html
    assert "data-usage=" not in html  # no failure header speaks usage


def test_broken_zeros_lead_the_failure_header(usage_results):
    import dataclasses

    result = next(r for r in usage_results if r.outcome == "passed" and r.outputs)
    y = dataclasses.replace(result.outputs[0], broken_zeros=3, passed=False)
    broken = dataclasses.replace(result, outcome="failed", outputs=[y, *result.outputs[1:]])
    view = build_run_view(header(), [broken])
    (line,) = view.failures
    assert line.broken_zeros == 3 and line.severity == math.inf
    assert "3 elements expected exactly 0 came out non-zero" in render_html(view)
