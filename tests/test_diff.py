"""``convmatrix diff``: a correct kernel against one with a seeded bug, a run against itself,
the error-regression rule (factor and noise floor) and the CLI's exit codes, on real databases."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from reports_support import cases, synthetic_results, tile_plus_one_channel_last, write_run
from test_report_view import header

from convmatrix.cli import main
from convmatrix.compare.errors import ErrorRule, default_floor, growth
from convmatrix.compare.runs import DiffOptions
from convmatrix.core.records import CaseResult
from convmatrix.db import open_database
from convmatrix.reports.diff import build_diff


def _three_runs(url: str, engine):
    """Run 1: correct kernel; run 2: seeded tile+1/channel_last bug; run 3: correct again."""
    good = synthetic_results(200, timed_every=3)
    bad = synthetic_results(200, bug=tile_plus_one_channel_last, timed_every=3)
    ids = [
        write_run(engine, good, commit="1" * 40),
        write_run(engine, bad, commit="2" * 40),
        write_run(engine, good, commit="3" * 40),
    ]
    return url, ids, good, bad


@pytest.fixture
def runs(db_url, db_engine):
    """The three runs on SQLite and on PostgreSQL."""
    return _three_runs(db_url, db_engine)


@pytest.fixture
def sqlite_runs(sqlite_url):
    """The three runs on SQLite only, for what does not depend on the backend."""
    engine = open_database(sqlite_url)
    yield _three_runs(sqlite_url, engine)
    engine.dispose()


def test_seeded_bug_lists_new_failures_and_fails_the_gate(runs, tmp_path, capsys):
    db_url, (good_id, bad_id, _), _, bad = runs
    out = tmp_path / "d" / "diff.html"
    argv = ["diff", str(good_id), str(bad_id), "--db", db_url, "--out", str(out)]
    assert main([*argv, "--fail-on", "new-failures"]) == 1
    text = capsys.readouterr().out
    data = json.loads(out.with_suffix(".json").read_text())
    buggy = {r.case.id for r in bad if tile_plus_one_channel_last(r.case)}
    assert buggy and {c["case_id"] for c in data["new_failures"]} == buggy
    assert f"new failures: {len(buggy)}" in text and "diff: failing on new-failures" in text
    # Every output of a broken case grew from rounding level to O(1): all are regressions.
    regressed = {(e["case_id"], e["output"]) for e in data["error_regressions"]}
    assert regressed == {
        (r.case.id, m.output) for r in bad if r.case.id in buggy for m in r.outputs
    }
    assert data["fixed"] == [] and data["added"] == [] and data["removed"] == []
    # The crashed extra case fails in both runs.
    assert [c["head_outcome"] for c in data["still_failing"]] == ["crashed"]
    assert "REGRESSED" in out.read_text()


def test_fixing_the_bug_shows_up_as_fixed(sqlite_runs, capsys):
    db_url, (_, bad_id, fixed_id), _, bad = sqlite_runs
    assert main(["diff", str(bad_id), str(fixed_id), "--db", db_url, "--fail-on",
                 "new-failures,error-regression"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    n = sum(1 for r in bad if tile_plus_one_channel_last(r.case))
    assert f"fixed: {n}" in text and "new failures: 0" in text


def test_a_run_against_itself_is_empty_and_passes_every_gate(runs, tmp_path, capsys):
    db_url, (_, bad_id, _), _, _ = runs
    out = tmp_path / "self.html"
    argv = ["diff", str(bad_id), str(bad_id), "--db", db_url, "--out", str(out)]
    gates = ["--fail-on", "new-failures", "--fail-on", "error-regression,timing-regression"]
    assert main([*argv, *gates]) == 0
    assert "no changes" in capsys.readouterr().out
    data = json.loads(out.with_suffix(".json").read_text())
    for section in ("new_failures", "fixed", "error_regressions", "error_improvements",
                    "added", "removed", "newly_skipped"):  # fmt: skip
        assert data[section] == [], section
    assert data["timing"]["regressions"] == [] and data["timing"]["unchanged"] > 0


def test_previous_compares_with_the_earlier_run_of_the_same_kernel(sqlite_runs, capsys):
    db_url, (good_id, bad_id, fixed_id), _, _ = sqlite_runs
    assert main(["diff", "--previous", "latest", "--db", db_url]) == 0
    assert f"(run {bad_id}) -> tiled @ 3333333333 (run {fixed_id})" in capsys.readouterr().out
    assert main(["diff", "--previous", str(good_id), "--db", db_url]) == 0
    assert "no earlier run" in capsys.readouterr().out


def test_the_text_says_how_many_more_and_where_to_see_them(sqlite_url, capsys):
    engine = open_database(sqlite_url)
    write_run(engine, synthetic_results(120, extras=False), commit="1" * 40)
    broken = {c.id for c in cases(120)[:13]}
    write_run(engine, synthetic_results(120, bug=lambda c: c.id in broken, extras=False))
    engine.dispose()
    assert main(["diff", "1", "2", "--db", sqlite_url]) == 0
    printed = capsys.readouterr().out
    assert printed.count("NEW FAILURE") == 10
    assert "... and 3 more new failures: see the diff report (convmatrix diff 1 2 --out" in printed
    assert printed.count("REGRESSION   ") == 10 and "more error regressions: see the" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["diff", "1"], "give two runs"),
        (["diff", "--previous", "1", "2"], "--previous takes exactly one run"),
        (["diff", "1", "2", "--fail-on", "slower"], "--fail-on 'slower'"),
        (["diff", "1", "2", "--floor", "x=abc"], "--floor 'x=abc'"),
        (["diff", "1", "2", "--factor", "0.5"], "--factor 0.5"),
        (["diff", "1", "99"], "HEAD: run '99' matches no run"),
    ],
)
def test_usage_errors(sqlite_runs, capsys, argv, message):
    db_url = sqlite_runs[0]
    assert main([*argv, "--db", db_url]) == 2
    assert message in capsys.readouterr().err


# -- the rule, on records ----------------------------------------------------------------------
def _with_y(result: CaseResult, e_rel: float, e_norm: float) -> CaseResult:
    outputs = [
        dataclasses.replace(m, e_rel=e_rel, e_norm=e_norm) if m.output == "y" else m
        for m in result.outputs
    ]
    return dataclasses.replace(result, outputs=outputs)


@pytest.fixture(scope="module")
def fp32_case():
    """One passing fp32 result whose y errors the tests set explicitly."""
    return next(
        r for r in synthetic_results(60, extras=False)
        if r.case.x_dtype == "float32" and r.outcome == "passed"
    )  # fmt: skip


def _regressions(base: CaseResult, head: CaseResult, options: DiffOptions | None = None):
    view = build_diff(header(), [base], header(), [head], options)
    return [(e.output, e.metrics) for e in view.error_regressions]


def test_growth_makes_nan_and_zero_explicit():
    assert growth(1e-7, 3e-7) == pytest.approx(3.0, rel=1e-15)
    assert growth(1e-7, math.nan) == math.inf
    assert growth(math.nan, 1e-7) == 0.0
    assert growth(math.nan, math.nan) == 1.0
    assert growth(0.0, 1e-9) == math.inf and growth(0.0, 0.0) == 1.0


def test_error_regression_needs_the_factor_and_the_noise_floor(fp32_case):
    floor = default_floor("float32", "y")
    assert floor == 4 * 2.0**-24  # 4 unit roundoffs of fp32, about 2.4e-7
    base = _with_y(fp32_case, e_rel=1e-7, e_norm=2e-8)
    # x1.5: under the factor 2.
    assert _regressions(base, _with_y(fp32_case, 1.5e-7, 3e-8)) == []
    # x3 on both, but only e_rel ends above the floor: e_norm's growth is rounding noise.
    assert _regressions(base, _with_y(fp32_case, 3e-7, 6e-8)) == [("y", ["e_rel"])]
    # x1000 on both: both metrics regress.
    worse = _with_y(fp32_case, 1e-4, 2e-5)
    assert _regressions(base, worse) == [("y", ["e_rel", "e_norm"])]
    # Configurable: a floor above the new values, per dtype or for all, or a larger factor.
    assert _regressions(base, worse, DiffOptions(ErrorRule(floor=1e-3))) == []
    assert _regressions(base, worse, DiffOptions(ErrorRule(floors={"float32": 1e-3}))) == []
    assert _regressions(base, worse, DiffOptions(ErrorRule(floors={"bfloat16": 1e-3}))) != []
    assert _regressions(base, worse, DiffOptions(ErrorRule(factor=2000.0))) == []
    # The other way round it is an improvement, not a regression.
    view = build_diff(header(), [worse], header(), [base])
    assert view.error_regressions == [] and [e.output for e in view.error_improvements] == ["y"]


def test_a_new_nan_is_always_a_regression(fp32_case):
    base = _with_y(fp32_case, e_rel=1e-7, e_norm=2e-8)
    view = build_diff(header(), [base], header(), [_with_y(fp32_case, math.nan, 2e-8)])
    assert [(e.output, e.metrics, e.growth) for e in view.error_regressions] == [
        ("y", ["e_rel"], math.inf)
    ]


def test_added_and_removed_cases_and_new_failures_among_added():
    results = synthetic_results(20, extras=False)
    broken = dataclasses.replace(results[5], outcome="failed")
    view = build_diff(header(), results[:10], header(), [*results[2:10], broken, *results[10:12]])
    assert {c.case_id for c in view.removed} == {r.case.id for r in results[:2]}
    assert {c.case_id for c in view.added} == {r.case.id for r in results[10:12]}
    assert [c.case_id for c in view.new_failures] == [results[5].case.id]
    assert view.conditions() == {
        "new-failures": True, "error-regression": False, "timing-regression": False,
        "timing-history": False,
    }  # fmt: skip
