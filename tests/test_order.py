"""A parallel run hands its cases out the largest first (runners.run.order): under xdist's
worksteal each worker starts on half of the ordered cases, so the largest case is the first
one a worker runs, never one left for the end; ``-n 0`` keeps the matrix order."""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_helpers import convmatrix_cmd, run
from sqlalchemy import select

from convmatrix.db import Session, open_database
from convmatrix.db.models import CaseRow
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.run.order import expected_work, largest_first

# Eight small fwd cases of one size and, last in matrix order, one 1000x larger.
_MATRIX = """\
name: lopsided
seed: 0
suites:
  small:
    op: fwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [16]
      dim: [8]
      batch: [1]
      layout: [channel_first, channel_last]
      activation: [null, silu]
      bias: [true, false]
  large:
    op: fwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [2048]
      dim: [64]
      batch: [1]
"""


def _cases(tmp_path: Path):
    path = tmp_path / "lopsided.matrix.yaml"
    path.write_text(_MATRIX)
    return str(path), expand_matrix(load_matrix(str(path)), TorchKernel()).cases


def test_the_order_ranks_by_expected_work_and_keeps_ties_in_matrix_order(tmp_path):
    _, cases = _cases(tmp_path)
    ordered = largest_first(cases, lambda c: c)
    assert ordered[0] == cases[-1]
    assert ordered[1:] == cases[:-1]  # the small ones, of one size, in matrix order
    assert [expected_work(c) for c in ordered] == sorted(map(expected_work, cases), reverse=True)
    things = ["not a case", *cases]  # what has no case goes last
    assert largest_first(things, lambda t: t if not isinstance(t, str) else None)[-1] == things[0]


def _run_order(tmp_path: Path, workers: int) -> dict[str, list[str]]:
    """The case ids each worker ran, in the order it ran them, from a real run's database."""
    source, _ = _cases(tmp_path)
    url = f"sqlite:///{tmp_path}/w{workers}.db"
    args = ["run", "--matrix", source, "--kernel", "torch", "--db", url, "-n", str(workers)]
    done = run(convmatrix_cmd(*args, "--reference-cache", "off"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    order: dict[str, list[str]] = {}
    engine = open_database(url)
    try:
        with Session(engine) as session:  # rows in the order they arrived
            rows = session.execute(select(CaseRow.worker, CaseRow.case_id).order_by(CaseRow.id))
            for worker, case_id in rows:
                order.setdefault(worker or "main", []).append(case_id)
    finally:
        engine.dispose()
    return order


@pytest.mark.slow
def test_two_workers_start_on_the_largest_case(tmp_path):
    _, cases = _cases(tmp_path)
    order = _run_order(tmp_path, 2)
    assert sorted(order) == ["gw0", "gw1"]
    assert sum(map(len, order.values())) == len(cases)
    # worksteal gives one worker the first half of the ordered cases: it starts on the
    # largest, which in matrix order would be the last case of the other half
    assert cases[-1].id in {ran[0] for ran in order.values()}


@pytest.mark.slow
def test_one_process_runs_the_matrix_order(tmp_path):
    _, cases = _cases(tmp_path)
    assert _run_order(tmp_path, 0) == {"main": [c.id for c in cases]}


def test_ray_dispatches_its_queue_largest_first(tmp_path):
    """The Ray driver's queue, which idle actors take from the front, in the same order."""
    from convmatrix.runners.executors.ray import _Driver
    from convmatrix.runners.options import RunOptions
    from convmatrix.runners.run.controller import Setup
    from convmatrix.runners.run.store import MemoryStore

    source, cases = _cases(tmp_path)
    options = RunOptions(matrix=source, kernel="torch", device="cpu", workers=2)
    setup = Setup.of(options.checked(), MemoryStore())
    driver = _Driver(None, setup, setup.controller(), [], batch=1)
    assert [t.case for t in driver.queue] == largest_first(cases, lambda c: c)
    assert driver.queue[0].case == cases[-1]
