"""A pytest plugin for ``bench_harness.py --probe``: the harness's cost of each item, measured
inside the run that pays it.

Loaded with ``PYTEST_ADDOPTS="-p harness_probe"`` (``benchmarks/`` on ``PYTHONPATH``) into a
``convmatrix run``. Per item, on two clocks (wall: ``perf_counter``; CPU of the whole process,
its reader and alarm threads included: ``process_time``): the item's whole
``pytest_runtest_protocol`` (setup, call, teardown, their reports, the recording under
``-n 0``) minus the time of the case's work itself (``execute._execute``, what the bare loop
does), and the time from one item's end to the next one's start (xdist's worker loop, the
sending of its events). In the process that records (the controller, or the one process of
``-n 0``), also the
time each ``call`` report takes to be handled (``pytest_runtest_logreport``). Each process
appends one JSON line to ``$CONVMATRIX_PROBE_OUT`` when its session ends.

Why inside the run: on a shared 2-core host the whole command's wall time varies by more
than the 1.5 ms a case being measured (benchmarks.md, "Harness per case"); the difference of
two clocks read around the same item in the same process does not carry that noise.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from convmatrix.runners.case import execute

_items: list[tuple[float, float]] = []  # (wall, cpu) of the harness around each case
_reports: list[tuple[float, float]] = []  # (wall, cpu) of handling each call report
_works: list[tuple[float, float]] = []  # (wall, cpu) of each case's work (execute._execute)
_gaps: list[tuple[float, float]] = []  # (wall, cpu) from one item's end to the next's start
_work = [0.0, 0.0]  # the current item's _execute time (wall, cpu)
_last_end: list[tuple[float, float]] = []  # when the last item ended (wall, cpu)
_real_execute = execute._execute


def _timed_execute(*args: Any, **kwargs: Any) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        return _real_execute(*args, **kwargs)
    finally:
        _work[0] += time.perf_counter() - wall
        _work[1] += time.process_time() - cpu


execute._execute = _timed_execute  # run_case looks it up at each call


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _work[0] = _work[1] = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    if _last_end:
        _gaps.append((wall - _last_end[0][0], cpu - _last_end[0][1]))
    try:
        return (yield)
    finally:
        spent = (time.perf_counter() - wall, time.process_time() - cpu)
        if _work[0] > 0.0:  # a case item (not a plain test beside the matrix)
            _items.append((spent[0] - _work[0], spent[1] - _work[1]))
            _works.append((_work[0], _work[1]))
        _last_end[:] = [(time.perf_counter(), time.process_time())]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        return (yield)
    finally:
        if report.when == "call":
            _reports.append((time.perf_counter() - wall, time.process_time() - cpu))


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("CONVMATRIX_PROBE_OUT")
    if not out:
        return
    worker = getattr(session.config, "workerinput", None)
    line = {
        "process": "main" if worker is None else str(worker["workerid"]),
        "items": _items,
        "reports": _reports,
        "work": _works,
        "gaps": _gaps,
    }
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
