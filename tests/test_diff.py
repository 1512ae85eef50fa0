"""``convmatrix diff``: a correct kernel against one with a seeded bug, a run against itself,
the error-regression rule (factor and noise level) and the CLI's exit codes, on real databases."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from reports_support import cases, synthetic_results, tile_plus_one_channel_last, write_run
from test_report_view import header

from convmatrix.cli import main
from convmatrix.compare.errors import (
    DEFAULT_FACTOR,
    DEFAULT_FLOOR,
    ErrorRule,
    growth,
    noise_level,
)
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
        (["diff", "1", "2", "--floor", "x=abc"], "--floor 'x=abc': expected a bound usage"),
        (["diff", "1", "2", "--floor", "-1"], "--floor '-1': expected a bound usage"),
        (["diff", "1", "2", "--floor", "nan"], "--floor 'nan'"),
        (["diff", "1", "2", "--floor", "bf17=0.2"], "--floor"),
        (["diff", "1", "2", "--factor", "0.5"], "--factor 0.5"),
        (["diff", "1", "99"], "HEAD: run '99' matches no run"),
    ],
)
def test_usage_errors(sqlite_runs, capsys, argv, message):
    db_url = sqlite_runs[0]
    assert main([*argv, "--db", db_url]) == 2
    assert message in capsys.readouterr().err


# -- the rule, on records ----------------------------------------------------------------------
def _with_y(result: CaseResult, e_rel: float, e_norm: float, **fields) -> CaseResult:
    outputs = [
        dataclasses.replace(m, e_rel=e_rel, e_norm=e_norm, **fields) if m.output == "y" else m
        for m in result.outputs
    ]
    return dataclasses.replace(result, outputs=outputs)


def _usage(result: CaseResult, usage: float | None, zeros: int | None = 0, **errors) -> CaseResult:
    """``result`` with y at bound usage ``usage`` (e_rel/e_norm 1e-7/2e-8 unless given)."""
    e_rel, e_norm = errors.get("e_rel", 1e-7), errors.get("e_norm", 2e-8)
    return _with_y(result, e_rel, e_norm, bound_usage=usage, broken_zeros=zeros)


@pytest.fixture(scope="module")
def fp32_case():
    """One passing fp32 result whose y errors the tests set explicitly."""
    return next(
        r for r in synthetic_results(60, extras=False)
        if r.case.x_dtype == "float32" and r.outcome == "passed"
    )  # fmt: skip


def _regressions(base: CaseResult, head: CaseResult, options=None, declared=(None, None)):
    """(output, metrics) of each error regression; ``declared``: each run's recorded
    arithmetic."""
    view = build_diff(
        header(arithmetic=declared[0]), [base], header(arithmetic=declared[1]), [head], options
    )
    return [(e.output, e.metrics) for e in view.error_regressions]


def test_growth_makes_nan_and_zero_explicit():
    assert growth(1e-7, 3e-7) == pytest.approx(3.0, rel=1e-15)
    assert growth(1e-7, math.nan) == math.inf
    assert growth(math.nan, 1e-7) == 0.0
    assert growth(math.nan, math.nan) == 1.0
    assert growth(0.0, 1e-9) == math.inf and growth(0.0, 0.0) == 1.0


def test_bound_usage_judges_by_the_factor_and_the_usage_floor(fp32_case):
    assert (DEFAULT_FACTOR, DEFAULT_FLOOR) == (16.0, 0.1)  # docs/regression-rule.md
    base = _usage(fp32_case, 0.005)
    # x15: under the factor, though far above the floor
    assert _regressions(base, _usage(fp32_case, 0.075)) == []
    # x20, but ending at 0.09: under the floor (a few elements' rounding)
    assert _regressions(_usage(fp32_case, 0.0045), _usage(fp32_case, 0.09)) == []
    # x22 and above the floor: a precision regression, though the case still passes (<= 2)
    assert _regressions(base, _usage(fp32_case, 0.11)) == [("y", ["usage"])]
    assert _regressions(base, _usage(fp32_case, 0.1)) == []  # "above": not at the floor
    # e_rel and e_norm are shown, not judged: x1000 on both with the usage unchanged is
    # nothing, and the usage growing with e_rel unchanged is a regression
    same = _usage(fp32_case, 0.005, e_rel=1e-4, e_norm=2e-5)
    assert _regressions(base, same) == []
    view = build_diff(header(), [base], header(), [_usage(fp32_case, 0.5)])
    (change,) = view.error_regressions
    assert (change.measure, change.why, change.factor, change.floor) == ("usage", None, 16.0, 0.1)
    assert (change.base_usage, change.head_usage) == (0.005, 0.5)
    assert change.growth == pytest.approx(100.0, rel=1e-12)  # 0.5 / 0.005 in doubles
    assert (change.base_rel, change.head_rel) == (1e-7, 1e-7)
    # the other way round it is an improvement
    view = build_diff(header(), [_usage(fp32_case, 0.5)], header(), [base])
    assert view.error_regressions == [] and [e.metrics for e in view.error_improvements] == [
        ["usage"]
    ]


def test_the_usage_rule_is_configurable(fp32_case):
    base, head = _usage(fp32_case, 0.005), _usage(fp32_case, 0.5)
    assert _regressions(base, head, DiffOptions(ErrorRule(floor=0.6))) == []
    assert _regressions(base, head, DiffOptions(ErrorRule(floors={"float32": 0.6}))) == []
    assert _regressions(base, head, DiffOptions(ErrorRule(floors={"bfloat16": 0.6}))) != []
    assert _regressions(base, head, DiffOptions(ErrorRule(factor=200.0))) == []
    assert _regressions(base, head, DiffOptions(ErrorRule(factor=50.0))) != []


def test_a_failing_bf16_case_under_the_old_floor_is_an_error_regression():
    """The issue's case: dx failing at usage 151 with e_rel 0.0147, under the 0.016 bf16 floor
    of the e_rel rule: no error regression then, one now."""
    bf16 = next(
        r for r in synthetic_results(60, extras=False, usage=True)
        if r.case.x_dtype == "bfloat16" and r.case.op == "fwd_bwd"
    )  # fmt: skip
    base = _with_y(bf16, 0.004, 0.001, bound_usage=0.8)
    head = _with_y(bf16, 0.0147, 0.004, bound_usage=151.0, passed=False)
    assert noise_level("bfloat16", "y") == pytest.approx(0.0156, rel=0.01)

    def without_usage(r: CaseResult) -> CaseResult:
        return dataclasses.replace(
            r, outputs=[dataclasses.replace(m, bound_usage=None) for m in r.outputs]
        )

    assert _regressions(without_usage(base), without_usage(head)) == []
    assert _regressions(base, head) == [("y", ["usage"])]


def test_elements_expected_zero_coming_out_non_zero_are_a_regression(fp32_case):
    base = _usage(fp32_case, 0.5, zeros=0)
    view = build_diff(header(), [base], header(), [_usage(fp32_case, 0.5, zeros=32)])
    (change,) = view.error_regressions
    assert (change.metrics, change.base_zeros, change.head_zeros) == (["broken_zeros"], 0, 32)
    assert change.growth == math.inf
    back = build_diff(header(), [_usage(fp32_case, 0.5, zeros=32)], header(), [base])
    assert back.error_regressions == [] and back.error_improvements[0].metrics == ["broken_zeros"]


def test_without_usage_on_either_side_the_e_rel_rule_judges(fp32_case):
    """Runs written before the bound model (or outputs without a bound): the e_rel/e_norm rule
    of before, factor 2 above 4 unit roundoffs."""
    floor = noise_level("float32", "y")
    assert floor == 4 * 2.0**-24  # 4 unit roundoffs of fp32, about 2.4e-7
    base = _with_y(fp32_case, e_rel=1e-7, e_norm=2e-8)
    assert base.outputs[0].bound_usage is None
    # x1.5: under the factor 2.
    assert _regressions(base, _with_y(fp32_case, 1.5e-7, 3e-8)) == []
    # x3 on both, but only e_rel ends above the floor: e_norm's growth is rounding noise.
    assert _regressions(base, _with_y(fp32_case, 3e-7, 6e-8)) == [("y", ["e_rel"])]
    # x1000 on both: both metrics regress, and the change says why usage did not judge.
    worse = _with_y(fp32_case, 1e-4, 2e-5)
    view = build_diff(header(), [base], header(), [_usage(fp32_case, 0.5, e_rel=1e-4)])
    (change,) = view.error_regressions
    assert (change.measure, change.factor, change.floor) == ("e_rel", 2.0, floor)
    assert change.why == "no bound usage recorded in base"
    assert change.text() == (
        "e_rel 1e-07 -> 0.0001, e_norm 2e-08 -> 2e-08 (x1e+03; by e_rel/e_norm: no bound usage "
        "recorded in base); usage - -> 0.5"
    )
    # the usage knobs do not move the fallback
    assert _regressions(base, worse, DiffOptions(ErrorRule(floor=1e3, factor=1e3))) != []
    # the other way round it is an improvement, not a regression
    view = build_diff(header(), [worse], header(), [base])
    assert view.error_regressions == [] and [e.output for e in view.error_improvements] == ["y"]


def test_usage_under_different_declared_arithmetic_is_not_compared(fp32_case):
    """The bound follows the declaration: the torch path (intermediate "input") is allowed
    more than an FP32 kernel, so the same error is a smaller usage there. Where both runs
    recorded what their kernels declare and it differs, e_rel/e_norm judge."""
    fp32 = {"accumulate": "float32", "intermediate": "fp32", "deterministic": True}
    torch_path = {**fp32, "intermediate": "input"}
    base, head = _usage(fp32_case, 0.01), _usage(fp32_case, 0.7)  # same e_rel, e_norm
    assert _regressions(base, head, declared=(torch_path, fp32)) == []
    view = build_diff(header(arithmetic=torch_path), [base], header(arithmetic=fp32), [head])
    assert view.error_regressions == []
    assert _regressions(base, head, declared=(fp32, fp32)) == [("y", ["usage"])]
    # a declaration only one run recorded (the other predates it): usage judges
    assert _regressions(base, head, declared=(None, fp32)) == [("y", ["usage"])]
    # determinism is no part of the bound: a nondeterministic kernel's usage compares
    shuffled = {**fp32, "deterministic": False}
    assert _regressions(base, head, declared=(fp32, shuffled)) == [("y", ["usage"])]
    view = build_diff(
        header(arithmetic=torch_path), [base], header(arithmetic=fp32),
        [_usage(fp32_case, 0.7, e_rel=1e-5)],
    )  # fmt: skip
    (change,) = view.error_regressions
    assert change.measure == "e_rel" and "declared arithmetic differs" in (change.why or "")


def test_a_new_nan_is_always_a_regression(fp32_case):
    base = _with_y(fp32_case, e_rel=1e-7, e_norm=2e-8)
    view = build_diff(header(), [base], header(), [_with_y(fp32_case, math.nan, 2e-8)])
    assert [(e.output, e.metrics, e.growth) for e in view.error_regressions] == [
        ("y", ["e_rel"], math.inf)
    ]
    # under the usage rule a non-finite output is an infinite usage
    view = build_diff(header(), [_usage(fp32_case, 0.5)], header(), [_usage(fp32_case, math.inf)])
    assert [(e.metrics, e.growth) for e in view.error_regressions] == [(["usage"], math.inf)]


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


def test_runs_judged_by_usage_regress_by_usage_through_the_cli(db_url, db_engine, tmp_path, capsys):
    """Two runs that record bound usage (the default policy), on SQLite and PostgreSQL: every
    broken output is an error regression judged by usage, whatever its e_rel floor said; a
    usage floor above every broken output silences them, and a bad one is refused by name."""
    fp32 = {"accumulate": "float32", "intermediate": "fp32", "deterministic": True}
    good = synthetic_results(120, usage=True)
    bad = synthetic_results(120, bug=tile_plus_one_channel_last, usage=True)
    base_id = write_run(db_engine, good, commit="1" * 40, arithmetic=fp32)
    head_id = write_run(db_engine, bad, commit="2" * 40, arithmetic=fp32)
    out = tmp_path / "diff.html"
    argv = ["diff", str(base_id), str(head_id), "--db", db_url, "--out", str(out)]
    assert main([*argv, "--fail-on", "error-regression"]) == 1
    data = json.loads(out.with_suffix(".json").read_text())
    broken = {(r.case.id, m.output) for r in bad for m in r.outputs if not m.passed}
    assert broken
    assert {(e["case_id"], e["output"]) for e in data["error_regressions"]} == broken
    assert {e["measure"] for e in data["error_regressions"]} == {"usage"}
    text = capsys.readouterr().out
    assert "(bound usage x16 above 0.1; e_rel/e_norm x2 where usage cannot judge)" in text
    first = data["error_regressions"][0]
    growth = first["head_usage"] / first["base_usage"]
    assert (
        f"REGRESSION   {first['name']} {first['output']}: usage {first['base_usage']:.3g} -> "
        f"{first['head_usage']:.3g} (x{growth:.3g}); e_rel {first['base_rel']:.3g} -> "
        f"{first['head_rel']:.3g}"
    ) in text
    html = out.read_text()
    assert 'data-measure="usage"' in html and 'id="error-factor">16.0<' in html
    assert main([*argv, "--floor", "1000", "--fail-on", "error-regression"]) == 0
    assert "error regressions: 0" in capsys.readouterr().out
