"""``convmatrix report`` on real databases (a SQLite file and a PostgreSQL database) written by the
real ``ResultWriter``; the numbers in the JSON are checked against what was written."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from reports_support import XSS, synthetic_results, tile_plus_one_channel_last, write_run
from sqlalchemy.engine import make_url

from convmatrix.cli import main
from convmatrix.core.records import RunMeta
from convmatrix.db import ResultWriter, open_database


def _two_runs(engine):
    """A clean run (label 'good') and one with the seeded bug (label 'bad'), in that order."""
    good = synthetic_results(300)
    bad = synthetic_results(300, bug=tile_plus_one_channel_last)
    ids = (
        write_run(engine, good, commit="1" * 40, label="good"),
        write_run(engine, bad, commit="2" * 40, label="bad"),
    )
    return ids, good, bad


@pytest.fixture
def two_runs(db_engine):
    """On SQLite and on PostgreSQL."""
    return _two_runs(db_engine)


@pytest.fixture
def sqlite_two_runs(sqlite_url):
    """On SQLite only: for what does not depend on the backend."""
    engine = open_database(sqlite_url)
    yield _two_runs(engine)
    engine.dispose()


def test_report_writes_html_and_json_with_the_stored_numbers(db_url, two_runs, tmp_path, capsys):
    (_, bad_id), _, bad = two_runs
    rc = main(["report", "latest", "--db", db_url, "--out", str(tmp_path)])
    assert rc == 1  # the run has failures
    out = capsys.readouterr().out
    assert f"FAILED tiled @ 2222222222 (run {bad_id})" in out
    data = json.loads((tmp_path / f"run-{bad_id}.json").read_text())
    html = (tmp_path / f"run-{bad_id}.html").read_text()
    expected = Counter(r.outcome for r in bad)
    assert {k: v for k, v in data["run"]["counts"].items() if v} == dict(expected)
    failing = {r.case.id for r in bad if r.outcome in ("failed", "crashed")}
    assert {f["case_id"] for f in data["failures"]} == failing
    by_id = {r.case.id: r for r in bad}
    for f in data["failures"]:
        stored = {m.output: m for m in by_id[f["case_id"]].outputs}
        for o in f["outputs"]:
            # Exact: doubles round-trip through both databases bit for bit.
            assert o["e_rel"] == stored[o["output"]].e_rel
            assert o["e_norm"] == stored[o["output"]].e_norm
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_of_a_clean_run_exits_zero(sqlite_url, tmp_path):
    engine = open_database(sqlite_url)
    run_id = write_run(engine, synthetic_results(50, extras=False), label="clean")
    engine.dispose()
    assert main(["report", "clean", "--db", sqlite_url, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / f"run-{run_id}.json").read_text())
    assert data["failures"] == [] and data["run"]["counts"]["passed"] == 50


@pytest.mark.parametrize("spec", ["good", "1111", "1"])
def test_run_specs_label_commit_prefix_and_id(sqlite_url, sqlite_two_runs, tmp_path, spec):
    (good_id, _), _, _ = sqlite_two_runs
    assert main(["report", spec, "--db", sqlite_url, "--out", str(tmp_path)]) == 1  # extras crash
    assert (tmp_path / f"run-{good_id}.html").exists()


def test_unknown_run_is_a_usage_error(sqlite_url, sqlite_two_runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", "nosuchlabel", "--db", sqlite_url, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "RUN: run 'nosuchlabel' matches no run" in err
    assert not out.exists()


def test_missing_sqlite_file_is_a_usage_error_and_creates_nothing(tmp_path, capsys):
    path = tmp_path / "nope.db"
    assert main(["report", "latest", "--db", f"sqlite:///{path}"]) == 2
    assert f"database file {path} does not exist" in capsys.readouterr().err
    assert not path.exists()


def test_report_never_embeds_the_database_password(db_url, db_engine, tmp_path):
    """PostgreSQL here trusts local connections, so a password in the URL is accepted and
    ignored; for SQLite there is no password to leak, but the URL is shown redacted too."""
    write_run(db_engine, synthetic_results(20, extras=False))
    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":
        url = url.set(password="s3cr3t-pw")
    rendered = url.render_as_string(hide_password=False)
    out = tmp_path / "out"
    assert main(["report", "latest", "--db", rendered, "--out", str(out)]) == 0
    assert len(list(out.iterdir())) == 2
    for path in out.iterdir():
        assert "s3cr3t-pw" not in path.read_text()


def test_an_interrupted_run_is_incomplete_not_passed(sqlite_url, tmp_path, capsys):
    """Killed half-way with only passing results so far: the gate must not read it as a pass."""
    engine = open_database(sqlite_url)
    results = synthetic_results(10, extras=False)
    with pytest.raises(KeyboardInterrupt), ResultWriter(engine) as writer:
        writer.start_run(
            RunMeta(kernel="tiled", matrix="nightly", matrix_hash="0" * 64, n_planned=10)
        )
        for r in results[:4]:
            writer.add(r)
        raise KeyboardInterrupt
    engine.dispose()
    assert main(["report", "latest", "--db", sqlite_url, "--out", str(tmp_path / "o")]) == 1
    assert "INCOMPLETE tiled (run 1) [interrupted]: 4 passed" in capsys.readouterr().out
    assert (
        '<span class="verdict bad" id="verdict">INCOMPLETE</span>'
        in (tmp_path / "o" / "run-1.html").read_text()
    )


def test_a_stored_report_is_copied_out_byte_for_byte_and_its_json_never_parsed(
    sqlite_url, sqlite_two_runs, tmp_path, capsys
):
    """The second ``report`` of a finished run reads its stored pages: the files it writes
    are the stored bytes, and what it prints is the first report's, from a small stored
    summary: the run's JSON (megabytes for 10,000 cases) is copied, never parsed. A stored
    JSON page replaced by text that is no JSON shows it: it is written out as it is."""
    import zlib

    from sqlalchemy import update

    from convmatrix.db.tables import run_pages

    (_, bad_id), _, _ = sqlite_two_runs
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["report", str(bad_id), "--db", sqlite_url, "--out", str(first)]) == 1
    built = capsys.readouterr().out
    assert main(["report", str(bad_id), "--db", sqlite_url, "--out", str(second)]) == 1
    assert capsys.readouterr().out.replace(str(second), str(first)) == built
    assert "... and" in built  # more failures than the ten it names
    for name in (f"run-{bad_id}.html", f"run-{bad_id}.json"):
        assert (second / name).read_bytes() == (first / name).read_bytes(), name
    marker = '{"not": json, kept as stored}\n'
    engine = open_database(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            update(run_pages)
            .where(run_pages.c.run_id == bad_id, run_pages.c.name == "run.json")
            .values(body=zlib.compress(marker.encode()))
        )
    engine.dispose()
    third = tmp_path / "third"
    assert main(["report", str(bad_id), "--db", sqlite_url, "--out", str(third)]) == 1
    assert capsys.readouterr().out.replace(str(third), str(first)) == built
    assert (third / f"run-{bad_id}.json").read_bytes() == marker.encode()
