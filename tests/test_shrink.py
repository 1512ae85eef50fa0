"""The search's probe and ``convmatrix shrink``.

The probe judges a case through the run's own ``run_guarded`` on the run's kernel and policy:
its verdict must be the one ``convmatrix run`` records for the same case, and two failures
are told apart by what failed.
"""

from __future__ import annotations

import pytest
import torch

from convmatrix.kernels.doubles.seeded import CATALOGUE, base_case
from convmatrix.runners.options import RunOptions
from convmatrix.search.probe import Probe, ProbeOutcome


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def _probe(kernel: str, **options) -> Probe:
    return Probe(RunOptions(kernel=kernel, device="cpu", reference_cache="off", **options))


def test_probe_judges_like_a_run_and_counts():
    bug = CATALOGUE["halo_off_by_one"].bug
    probe = _probe("seeded:halo_off_by_one")
    failing = probe.judge(base_case(bug.trigger))
    quiet = probe.judge(base_case(bug.quiet))
    assert failing.failed and failing.outcome == "failed" and failing.signature == "failed: y"
    assert not quiet.failed and quiet.outcome == "passed" and quiet.signature == ""
    assert probe.runs == 2 and [c.seqlen for c, _ in probe.history] == [65, 64]
    assert failing.result is not None and failing.result.outcome == "failed"


def test_probe_puts_a_case_outside_the_contract_to_the_kernel_as_an_expected_error():
    probe = _probe("tiled")
    short = base_case({"op": "update", "state_len": 2})  # S < K-1: outside docs/spec.md §2
    assert "state_len 2 < width-1" in (probe.violation(short) or "")
    got = probe.judge(short)
    assert got.outcome == "passed"  # the kernel raised its clean error
    assert probe.history[-1][0].expect == "error"


def test_same_failure_compares_outcome_exception_and_outputs():
    def outcome(signature: str) -> ProbeOutcome:
        return ProbeOutcome(bool(signature), "x", signature, 0.0)

    y_dx, dx = outcome("failed: dx,y"), outcome("failed: dx")
    assert y_dx.same_failure(dx) and dx.same_failure(y_dx)
    assert not y_dx.same_failure(outcome("failed: dw"))
    assert not y_dx.same_failure(outcome("crashed"))
    assert not outcome("failed: raised IndexError").same_failure(y_dx)
    assert not y_dx.same_failure(outcome(""))


def test_probe_uses_the_matrix_policy_and_the_rule_given():
    probe = _probe("tiled", matrix="smoke", rule="threshold")
    assert probe.context.policy.rule == "threshold"
    assert probe.workload.name == "smoke"
