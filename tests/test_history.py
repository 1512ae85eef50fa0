"""``convmatrix history``: per run, worst and median errors of one dtype, case count and pass
rate, checked against values computed here from the records written; every format; filters."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest
from reports_support import synthetic_results, tile_plus_one_channel_last, write_run
from sqlalchemy import update
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.db import open_database
from convmatrix.db.database import Database
from convmatrix.db.models import Run
from convmatrix.reports.history_view import load_history as _load
from convmatrix.reports.history_view import parse_since


def _four_runs(url: str, engine):
    """Three runs of 'tiled' (good, seeded bug, good) ten days apart, and one of another kernel."""
    good = synthetic_results(200)
    bad = synthetic_results(200, bug=tile_plus_one_channel_last)
    ids = [
        write_run(engine, good, commit="1" * 40),
        write_run(engine, bad, commit="2" * 40),
        write_run(engine, good, commit="3" * 40),
        write_run(engine, good[:50], kernel="other", commit="4" * 40),
    ]
    now = datetime.now(timezone.utc)
    with Session(engine) as session, session.begin():
        for age, run_id in zip((30, 20, 10, 5), ids, strict=True):
            session.execute(
                update(Run).where(Run.id == run_id).values(started_at=now - timedelta(days=age))
            )
    return url, ids, {ids[0]: good, ids[1]: bad, ids[2]: good, ids[3]: good[:50]}


@pytest.fixture
def history_db(db_url, db_engine):
    """On SQLite and on PostgreSQL."""
    return _four_runs(db_url, db_engine)


@pytest.fixture
def sqlite_history_db(sqlite_url):
    """On SQLite only: formats and argument handling do not depend on the backend."""
    engine = open_database(sqlite_url)
    yield _four_runs(sqlite_url, engine)
    engine.dispose()


def _expected(results, dtype):
    """Per output: (cases, passed, worst e_rel, median e_rel, worst e_norm, median e_norm)."""
    by_output = defaultdict(list)
    for r in results:
        if r.case.x_dtype == dtype:
            for m in r.outputs:
                by_output[m.output].append(m)
    return {
        o: (len(ms), sum(m.passed for m in ms), max(m.e_rel for m in ms),
            statistics.median(m.e_rel for m in ms), max(m.e_norm for m in ms),
            statistics.median(m.e_norm for m in ms))
        for o, ms in by_output.items()
    }  # fmt: skip


def load_history(url, dtype, **filters):
    """The history view as both doors build it (the command and the served page)."""
    with Database(url, existing=True) as database, database.reading() as session:
        return _load(session, database.url, dtype, **filters)


def test_history_numbers_match_the_records(history_db):
    url, ids, written = history_db
    for dtype in ("float32", "bfloat16", "float16"):
        _check_history(url, ids, written, dtype)


def _check_history(url, ids, written, dtype):
    view = load_history(url, dtype, kernel="tiled")
    assert [r.run_id for r in view.runs] == ids[:3]  # oldest first, other kernel filtered out
    for run in view.runs:
        results = written[run.run_id]
        expected = _expected(results, dtype)
        assert set(run.outputs) == set(expected)
        for output, stats in run.outputs.items():
            cases, passed, worst_rel, median_rel, worst_norm, median_norm = expected[output]
            assert (stats.cases, stats.passed) == (cases, passed)
            # Max is exact; a median of an even count is one averaging of two doubles, in SQL
            # as here: 1e-15 relative allows only the last bit to differ.
            assert stats.worst_rel == worst_rel and stats.worst_norm == worst_norm
            assert stats.median_rel == pytest.approx(median_rel, rel=1e-15)
            assert stats.median_norm == pytest.approx(median_norm, rel=1e-15)
        mine = [r for r in results if r.case.x_dtype == dtype]
        assert run.cases == len(mine)
        assert run.passed == sum(r.outcome == "passed" for r in mine)
        assert run.failing == any(r.outcome in ("failed", "crashed") for r in mine)
    assert [r.commit[0] for r in view.runs] == ["1", "2", "3"]


def test_since_and_output_filters(sqlite_history_db):
    url, ids, _ = sqlite_history_db
    view = load_history(url, "bf16", since="15d")  # alias; the last two runs only
    assert view.dtype == "bfloat16"
    assert [r.run_id for r in view.runs] == ids[2:]
    view = load_history(url, "float32", output="dx", kernel="tiled")
    assert {o for r in view.runs for o in r.outputs} == {"dx"}


def test_formats(sqlite_history_db, tmp_path, capsys):
    url, ids, _ = sqlite_history_db
    base = ["history", "--dtype", "float32", "--kernel", "tiled", "--db", url]
    assert main([*base, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {int(r["run_id"]) for r in rows} == set(ids[:3])
    view = load_history(url, "float32", kernel="tiled")
    flat = {(r.run_id, o): s for r in view.runs for o, s in r.outputs.items()}
    for row in rows:
        # CSV writes repr-exact floats: the parsed number is the stored one.
        assert float(row["worst_rel"]) == flat[(int(row["run_id"]), row["output"])].worst_rel
    assert main([*base, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in data["runs"]] == ids[:3]
    assert main(base) == 0
    table = capsys.readouterr().out
    assert "worst_rel" in table.splitlines()[0] and "2222222222" in table
    out = tmp_path / "h" / "history.html"
    assert main([*base, "--format", "html", "--out", str(out)]) == 0
    html = out.read_text()
    assert html.count("<svg") == len(view.outputs) + 1  # one per output, plus the pass rate
    assert [r.failing for r in view.runs] == [False, True, False]  # the seeded bug's run
    assert html.count('class="mark"') == len(view.outputs) + 1  # shaded on every chart
    assert json.loads(out.with_suffix(".json").read_text())["kind"] == "history"


def test_empty_history_says_so(sqlite_history_db, capsys):
    url, _, _ = sqlite_history_db
    assert main(["history", "--dtype", "f16", "--kernel", "nonesuch", "--db", url]) == 0
    assert "no run holds metrics for dtype float16" in capsys.readouterr().err


def test_a_dtype_no_case_can_have_is_refused_naming_the_argument(sqlite_history_db, capsys):
    url, _, _ = sqlite_history_db
    assert main(["history", "--dtype", "float64", "--db", url]) == 2  # the reference's only
    assert "--dtype 'float64': not a case dtype" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--output", "zz"], "--output 'zz'"), (["--since", "yesterday"], "--since 'yesterday'")],
)
def test_usage_errors(sqlite_history_db, capsys, extra, message):
    url, _, _ = sqlite_history_db
    assert main(["history", "--dtype", "float32", "--db", url, *extra]) == 2
    assert message in capsys.readouterr().err


def test_parse_since():
    assert parse_since("2025-01-31") == datetime(2025, 1, 31, tzinfo=timezone.utc)
    moment = parse_since("7d")
    assert abs(datetime.now(timezone.utc) - timedelta(days=7) - moment) < timedelta(minutes=1)


def test_history_of_runs_judged_by_usage_shows_worst_and_median_usage(
    db_url, db_engine, tmp_path, capsys
):
    """Runs under the default policy record bound usage: history carries its worst and
    median per run and output in every format (on SQLite and PostgreSQL), and its charts draw
    the usage with the safety line."""
    good = synthetic_results(150, usage=True)
    bad = synthetic_results(150, bug=tile_plus_one_channel_last, usage=True)
    ids = [write_run(db_engine, rs, commit=c * 40) for rs, c in ((good, "1"), (bad, "2"))]
    view = load_history(db_url, "float32")
    assert [r.run_id for r in view.runs] == ids
    for run, results in zip(view.runs, (good, bad), strict=True):
        for output, stats in run.outputs.items():
            usage = [m.bound_usage for r in results if r.case.x_dtype == "float32"
                     for m in r.outputs if m.output == output]  # fmt: skip
            assert stats.worst_usage == max(usage)  # a max is exact
            # one averaging of two doubles at most, in SQL as here: the last bit may differ
            assert stats.median_usage == pytest.approx(statistics.median(usage), rel=1e-15)
    assert max(s.worst_usage for s in view.runs[1].outputs.values()) > 2  # the broken cases
    base = ["history", "--dtype", "float32", "--db", db_url]
    assert main([*base, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    flat = {(r.run_id, o): s for r in view.runs for o, s in r.outputs.items()}
    for row in rows:
        stats = flat[(int(row["run_id"]), row["output"])]
        assert float(row["worst_usage"]) == stats.worst_usage  # repr-exact in the CSV
        assert float(row["median_usage"]) == stats.median_usage
    assert main([*base, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    y = data["runs"][1]["outputs"]["y"]
    assert (y["worst_usage"], y["median_usage"]) == (flat[ids[1], "y"].worst_usage,
                                                     flat[ids[1], "y"].median_usage)  # fmt: skip
    assert main(base) == 0
    assert "worst_usage  median_usage" in capsys.readouterr().out.splitlines()[0]
    out = tmp_path / "history.html"
    assert main([*base, "--format", "html", "--out", str(out)]) == 0
    html = out.read_text()
    assert html.count(": bound usage per run</text>") == len(view.outputs)
    assert html.count('<g class="guide" data-value="2.0">') == len(view.outputs)
    assert "safety x2" in html and "errors per run" not in html


def test_each_kernel_and_matrix_is_a_line_of_its_own(sqlite_history_db, tmp_path):
    """Runs of two kernels (and of another matrix) never share a chart line; the x labels name
    the kernel; ``--matrix`` keeps one matrix."""
    url, ids, written = sqlite_history_db
    engine = open_database(url)
    other_matrix = write_run(engine, written[ids[0]][:40], matrix="smoke", commit="5" * 40)
    engine.dispose()
    view = load_history(url, "float32")
    assert view.lineages == [
        "tiled / nightly / cpu",
        "other / nightly / cpu",
        "tiled / smoke / cpu",
    ]
    assert [r.tag for r in view.runs] == [
        "tiled@11111111",
        "tiled@22222222",
        "tiled@33333333",
        "other@44444444",
        "tiled@55555555",
    ]
    out = tmp_path / "history.html"
    assert main(["history", "--dtype", "float32", "--format", "html", "--out", str(out),
                 "--db", url]) == 0  # fmt: skip
    html = out.read_text()
    # Each series is one polyline; a lineage's line joins only its own runs' points.
    lines = re.findall(
        r'<polyline class="series" data-series="([^"]+)"[^>]* points="([^"]*)"', html
    )
    pass_rate = {name: pts.split() for name, pts in lines if name.endswith("pass rate")}
    assert sorted(pass_rate) == sorted(
        f"{lin} pass rate" for lin in ("tiled / nightly / cpu", "other / nightly / cpu",
                                       "tiled / smoke / cpu")
    )  # fmt: skip
    assert [len(p) for p in (pass_rate[f"{k} pass rate"] for k in view.lineages)] == [3, 1, 1]
    only = load_history(url, "float32", matrix="smoke")
    assert [r.run_id for r in only.runs] == [other_matrix]
    assert main(["history", "--dtype", "float32", "--matrix", "nightly", "--kernel", "tiled",
                 "--format", "csv", "--db", url]) == 0  # fmt: skip
