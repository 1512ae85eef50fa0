"""The batched writer: round trips, batching, replacement, interruption, stale runs."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from dataclasses import asdict, fields, replace

import pytest
from db_fixtures import fake_meta, fake_result, same_float
from sqlalchemy import event, func, select

from convmatrix.core.errors import UsageError
from convmatrix.core.records import OutputMetrics
from convmatrix.db import ResultWriter, Session, load_results, open_database, resolve_run
from convmatrix.db.models import CaseRow, MetricRow, PropertyRow, Run, TimingRow


def _count(engine, model, run_id: int) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(model).where(model.run_id == run_id))


def _assert_same(loaded, written) -> None:
    """Every field equal; floats bit-identical (NaN equal to NaN: SQL NULL stands for it)."""
    assert loaded.case == written.case and loaded.case.id == written.case.id
    assert (loaded.outcome, loaded.message, loaded.worker) == (
        written.outcome,
        written.message,
        written.worker,
    )
    assert loaded.duration_s == written.duration_s
    assert len(loaded.outputs) == len(written.outputs)
    for got, want in zip(loaded.outputs, written.outputs, strict=True):
        for f in fields(OutputMetrics):
            a, b = getattr(got, f.name), getattr(want, f.name)
            assert same_float(a, b) if isinstance(b, float) else a == b, f.name
    assert loaded.properties == written.properties
    assert [asdict(t) for t in loaded.timings] == [asdict(t) for t in written.timings]


def test_every_field_round_trips(db_engine):
    results = [fake_result(i) for i in range(5)]
    results.append(fake_result(5, "failed", outputs=("y", "F", "dx", "dw", "db", "dS")))
    # An update case with every optional dimension set, and a NaN error from a broken kernel.
    update = fake_result(
        6,
        op="update",
        seqlen=None,
        tokens=2,
        steps=3,
        state_len=5,
        circular=True,
        slots="permuted_pad",
        outputs=("y", "state"),
    )
    update.outputs[0] = replace(update.outputs[0], e_rel=math.nan, e_norm=math.inf, passed=False)
    update.outcome = "failed"
    packed = fake_result(7, seq_lens=(5, -3, 8), checks=("packed_isolation",), activation="silu")
    packed.outputs.clear()
    crashed = fake_result(8, "crashed", outputs=())
    results += [update, packed, crashed]
    with ResultWriter(db_engine) as writer:
        run_id = writer.start_run(fake_meta(label="roundtrip", geometry={"time_tile": 64}))
        for result in results:
            writer.add(result)
    with Session(db_engine) as session:
        loaded = load_results(session, run_id)
        row = session.scalars(select(CaseRow).where(CaseRow.case_id == packed.case.id)).one()
        assert row.packed and row.activation == "silu" and row.x_dtype == "float32"
    assert len(loaded) == len(results)
    for got, want in zip(loaded, results, strict=True):
        _assert_same(got, want)


def test_run_metadata_and_counts_are_stored(db_engine):
    meta = fake_meta(
        kernel="mod:attr",
        kernel_commit="abc123",
        kernel_dirty=True,
        device_kind="cuda",
        device_name="NVIDIA H100",
        versions={"torch": "2.13.0", "cuda": "12.4"},
        label="nightly",
        options={"workers": 2},
        n_planned=4,
    )
    outcomes = ["passed", "failed", "timeout", "passed"]
    with ResultWriter(db_engine) as writer:
        run_id = writer.start_run(meta)
        for i, outcome in enumerate(outcomes):
            writer.add(fake_result(i, outcome))
    with Session(db_engine) as session:
        run = resolve_run(session, run_id)
    for name, value in asdict(meta).items():
        assert getattr(run, name) == value, name
    assert run.status == "finished" and run.finished_at >= run.started_at
    assert run.counts == {o: outcomes.count(o) for o in run.counts}


def test_results_are_committed_per_batch(db_url):
    engine = open_database(db_url)
    commits = []

    def committed(conn) -> None:  # the writer's commits, not its heartbeat thread's (every 2 s)
        if threading.current_thread().name != "convmatrix-heartbeat":
            commits.append(1)

    event.listen(engine, "commit", committed)
    writer = ResultWriter(engine, batch_size=50, max_delay_s=3600)
    run_id = writer.start_run(fake_meta())
    commits.clear()
    for i in range(49):
        writer.add(fake_result(i))
    assert _count(engine, CaseRow, run_id) == 0 and not commits  # buffered, nothing written
    writer.add(fake_result(49))
    assert _count(engine, CaseRow, run_id) == 50 and len(commits) == 1  # one transaction
    assert _count(engine, MetricRow, run_id) == 100  # two outputs per fake result
    for i in range(50, 60):
        writer.add(fake_result(i))
    writer.finish_run()
    assert _count(engine, CaseRow, run_id) == 60
    assert _count(engine, PropertyRow, run_id) == _count(engine, TimingRow, run_id) == 60
    engine.dispose()


def test_a_batch_that_does_not_fill_up_is_committed_after_the_delay(sqlite_url):
    engine = open_database(sqlite_url)
    writer = ResultWriter(engine, batch_size=1000, max_delay_s=1.0)
    run_id = writer.start_run(fake_meta())
    writer.add(fake_result(0))
    writer.add(fake_result(1))
    assert _count(engine, CaseRow, run_id) == 0  # buffered while the 1 s timer runs
    deadline = time.monotonic() + 30  # generous: only the order is asserted, not the time
    while _count(engine, CaseRow, run_id) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _count(engine, CaseRow, run_id) == 2  # with no further add
    writer.finish_run()
    engine.dispose()


def test_resuming_a_missing_run_is_a_usage_error(db_engine):
    with pytest.raises(UsageError, match="--resume: no run 999"):
        ResultWriter(db_engine).resume_run(999)


def test_a_stored_case_is_replaced_not_duplicated(db_engine):
    with ResultWriter(db_engine, batch_size=2) as writer:
        run_id = writer.start_run(fake_meta())
        for i in range(4):
            writer.add(fake_result(i, "crashed", outputs=()))
        writer.add(fake_result(1, "passed"))  # a retry of case 1, in a later batch
        writer.add(fake_result(2, "failed"))
        writer.add(fake_result(2, "passed"))  # twice within one batch: the last one counts
    with Session(db_engine) as session:
        loaded = {r.case.id: r for r in load_results(session, run_id)}
        run = resolve_run(session, run_id)
    assert len(loaded) == 4
    assert loaded[fake_result(1).case.id].outcome == "passed"
    assert loaded[fake_result(2).case.id].outcome == "passed"
    assert len(loaded[fake_result(2).case.id].outputs) == 2
    assert run.counts["passed"] == 2 and run.counts["crashed"] == 2
    assert _count(db_engine, MetricRow, run_id) == 4


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_leaving_by_an_exception_keeps_results_and_marks_interrupted(db_engine, error):
    with pytest.raises(error), ResultWriter(db_engine, batch_size=100) as writer:
        run_id = writer.start_run(fake_meta())
        for i in range(7):
            writer.add(fake_result(i))
        raise error()
    with Session(db_engine) as session:
        run = resolve_run(session, run_id)
    assert run.status == "interrupted" and run.finished_at is not None
    assert run.counts["passed"] == 7 and _count(db_engine, CaseRow, run_id) == 7


def test_resume_continues_the_same_run(db_engine):
    with pytest.raises(KeyboardInterrupt), ResultWriter(db_engine) as writer:
        run_id = writer.start_run(fake_meta())
        for i in range(3):
            writer.add(fake_result(i))
        raise KeyboardInterrupt
    with ResultWriter(db_engine) as writer:
        writer.resume_run(run_id)
        for i in range(3, 5):
            writer.add(fake_result(i))
    with Session(db_engine) as session:
        run = resolve_run(session, run_id)
    assert run.status == "finished" and run.counts["passed"] == 5


def test_runs_of_dead_processes_are_marked_abandoned(db_engine):
    script = "import os; print(os.getpid())"
    dead = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    )
    writer = ResultWriter(db_engine)
    orphan = writer.start_run(fake_meta(label="orphan"))
    writer.add(fake_result(0))
    writer.flush()
    with Session(db_engine) as session, session.begin():
        session.get(Run, orphan).pid = int(dead.stdout)  # as if SIGKILLed mid-run
    live = ResultWriter(db_engine).start_run(fake_meta(label="next"))
    with Session(db_engine) as session:
        assert resolve_run(session, orphan).status == "abandoned"
        assert resolve_run(session, orphan).counts["passed"] == 1
        assert resolve_run(session, live).status == "running"


def test_finish_run_rejects_unknown_status(db_engine):
    writer = ResultWriter(db_engine)
    writer.start_run(fake_meta())
    with pytest.raises(ValueError, match="running, finished, interrupted, abandoned"):
        writer.finish_run(status="done")
