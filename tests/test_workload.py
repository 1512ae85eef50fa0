"""A run with ``--case`` plans only the named cases (runners.run.workload, matrix.expand): the
matrix is expanded no further than the last named case, only those cases become items, and
the workers take the controller's plan instead of expanding the matrix again."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

import convmatrix.matrix.expand as expand_module
from convmatrix.core.case import Case
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.registry import load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import Prepared, Setup
from convmatrix.runners.run.store import MemoryStore, Shard
from convmatrix.runners.run.workload import Wanted, load_workload, select_cases


def _calls(thunk, function=expand_module.expand_matrix) -> int:
    """How many times ``function`` runs inside ``thunk``."""
    code, count = function.__code__, 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code is code:
            count += 1

    sys.setprofile(profile)
    try:
        thunk()
    finally:
        sys.setprofile(None)
    return count


@pytest.fixture(scope="module")
def smoke():
    return expand_matrix(load_matrix("smoke"), TorchKernel()).cases


def test_a_case_of_the_first_suite_expands_that_suite_alone():
    """dao-parity's first case (of 9,756 in six suites): before, all were built to find it."""
    spec, kernel = load_matrix("dao-parity"), load("tiled")
    wanted = Wanted(["6b94032a196c"])
    found = expand_matrix(spec, kernel, keep=wanted.keeps, enough=wanted.found_all)
    assert [c.id for c in found.cases] == ["6b94032a196c"]
    assert len(found.suites) == 1 < len(spec.suites)


@pytest.mark.parametrize("how", ["id", "pytest_id", "prefix"])
def test_the_planned_cases_are_those_select_cases_picks_from_the_whole_matrix(smoke, how):
    picked = [smoke[3], smoke[-1]]
    if how == "prefix":
        wanted = [c.id[:4] for c in picked]  # may name more than one case: all are kept
    else:
        wanted = [getattr(c, how) for c in picked]
    planned = load_workload("smoke", TorchKernel(), wanted=wanted).cases
    assert planned == select_cases(smoke, wanted)
    assert Wanted(wanted).found_all(planned) == (how != "prefix")


def test_finding_the_named_cases_builds_a_pytest_id_only_for_cases_that_could_match(smoke):
    """A value is matched against a case's pytest id only when the id's first six digits end
    it: every value against every case, each building a pytest id, was 0.6 s of a 40-case
    dao-parity run's planning. Here each case's pytest id is built at most once or twice
    (kept, then counted as found), not once per value and case."""
    wanted = [smoke[1].id, smoke[4].pytest_id, smoke[7].id[:5], smoke[-1].pytest_id]
    pytest_id = Case.pytest_id.fget
    built = _calls(lambda: select_cases(smoke, wanted), pytest_id)
    kept = select_cases(smoke, wanted)
    assert {smoke[1].id, smoke[4].id, smoke[7].id, smoke[-1].id} <= {c.id for c in kept}
    assert built <= 2 * len(kept) < len(smoke)


def test_a_jsonl_source_keeps_the_named_cases_only(tmp_path, smoke):
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c.to_json()) + "\n" for c in smoke))
    assert load_workload(str(path), None, wanted=[smoke[2].id]).cases == [smoke[2]]


def test_workers_take_the_controllers_plan_and_expand_nothing(smoke):
    wanted = [smoke[5].id, smoke[-2].pytest_id]
    options = RunOptions(matrix="smoke", kernel="torch", device="cpu", workers=2, cases=wanted)
    prepared = Setup.of(options.checked(), MemoryStore()).prepared
    info = json.loads(json.dumps(prepared.handover()))  # what xdist's workerinput carries
    assert [c["id"] for c in info["planned"]["smoke"]] == [smoke[5].id, smoke[-2].id]
    rebuilt: list[Prepared] = []
    assert _calls(lambda: rebuilt.append(Prepared.rebuild(info, torch.device("cpu"), 0))) == 0
    assert rebuilt[0].workload("smoke").cases == [smoke[5], smoke[-2]]
    assert rebuilt[0].planned() == prepared.planned() == {smoke[5].id, smoke[-2].id}


def test_a_whole_run_hands_no_plan_over(smoke):
    options = RunOptions(matrix="smoke", kernel="torch", device="cpu", workers=2)
    prepared = Setup.of(options.checked(), MemoryStore()).prepared
    assert prepared.handover()["planned"] == {}
    assert prepared.workload("smoke").cases == smoke


def test_a_worker_rebuilds_every_field_the_controller_handed_over(smoke, tmp_path):
    """The hand-over is written once, from Prepared's fields: whatever the controller
    resolved (a shard, a rule, the cache, threads, the done cases) reaches the worker."""
    options = RunOptions(
        matrix="smoke", kernel="torch", device="cpu", workers=2, rule="threshold",
        case_timeout=7.0, reference_device="host", max_cases=5000, threads="3",
        reference_cache=str(tmp_path / "cache"), reference_cache_size="1M",
    )  # fmt: skip
    prepared = Setup.of(options.checked(), MemoryStore()).prepared
    prepared.done = {smoke[0].id, smoke[1].id}
    prepared.shard = Shard(1, 3, "nightly")  # as a sharded run's store resolves it
    info = json.loads(json.dumps(prepared.handover()))  # what xdist's workerinput carries
    rebuilt = Prepared.rebuild(info, torch.device("cpu"), 1)
    local = {"kernel", "device", "device_index", "resume", "workloads", "by_pytest_id", "given"}
    for f in dataclasses.fields(Prepared):
        if f.name not in local and not f.name.startswith("_"):
            assert getattr(rebuilt, f.name) == getattr(prepared, f.name), f.name
    assert (rebuilt.rule, rebuilt.shard.index, rebuilt.threads.spec) == ("threshold", 1, "3")
    assert rebuilt.device_index == 1 and rebuilt.planned() == prepared.planned()
