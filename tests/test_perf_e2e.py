"""Timing end to end: ``convmatrix run`` on a timed matrix, the run report, ``convmatrix diff``.

Real processes, real xdist workers, a real SQLite file. The kernel is ``timing_kernels:Busy``
(tests/resources/kernels): the torch path plus CPU time spun in proportion to its work, so its
timings hardly move between runs whatever else the machine does, and its 1.5x-slowed twin
(``convmatrix.kernels.doubles.slowed``) is 1.5x slower by construction. The assertions are about the
detector's decisions and the recorded structure, never about a duration. The built-in perf
matrix with the real ``tiled`` kernel runs two of its cases.
"""

from __future__ import annotations

import json
import random

import pytest
from db_fixtures import fake_case, fake_meta
from runner_helpers import RESOURCES, convmatrix_cmd, results, run, runs

from convmatrix.core.records import CaseResult, TimingResult
from convmatrix.db import ResultWriter, open_database
from convmatrix.runners.case.timing.perfmodel import work_of

pytestmark = pytest.mark.slow  # real convmatrix processes, about 2.5 minutes together

PERF_TINY = RESOURCES / "matrices" / "perf_tiny.matrix.yaml"
SLOWED = "convmatrix.kernels.doubles.slowed:make(base=timing_kernels:Busy,percent=150)"


@pytest.fixture(scope="module")
def perf_runs(tmp_path_factory):
    """(db url, tmp dir, run ids): Busy twice (A/A), then Busy slowed 1.5x."""
    tmp = tmp_path_factory.mktemp("perf")
    url = f"sqlite:///{tmp / 'perf.db'}"
    for kernel, extra in (("timing_kernels:Busy", ["--report", str(tmp / "report")]),
                          ("timing_kernels:Busy", []), (SLOWED, [])):  # fmt: skip
        args = ["run", "--matrix", str(PERF_TINY), "--kernel", kernel, "-n", "2", "--db", url]
        done = run(convmatrix_cmd(*args, *extra), tmp)
        assert done.returncode == 0, done.stdout + done.stderr
    return url, tmp, [r.id for r in runs(url)]


def test_timed_run_records_every_scope_with_its_bound_and_efficiency(perf_runs):
    url, _, (first, *_) = perf_runs
    stored = results(url, first)
    assert len(stored) == 7 and all(r.outcome == "passed" for r in stored)
    for r in stored:
        by = {t.scope: t for t in r.timings}
        assert {"kernel", "op", "subgraph", "framework", "memcpy", "fma"} <= set(by)
        for scope in ("kernel", "op", "subgraph", "framework"):
            t = by[scope]
            assert t.n >= 6 and len(t.samples) == t.n and t.cold_s is not None
            assert t.floor_s > 0 and t.efficiency == t.floor_s / t.median_s
        assert (by["op"].flops, by["op"].bytes_moved) == (work_of(r.case).flops,
                                                            work_of(r.case).bytes)  # fmt: skip
        if r.case.op == "update":
            modes = {(t.scope, t.mode) for t in r.timings}
            assert {("op", "reset"), ("op", "advance"), ("subgraph", "advance")} <= modes
        if r.case.op == "fwd_bwd":
            assert {"kernel.bwd", "op.bwd"} <= set(by)


def test_run_report_shows_the_scopes_rates_and_sweep_charts(perf_runs):
    _, tmp, (first, *_) = perf_runs
    report = tmp / "report"
    view = json.loads((report / f"run-{first}.json").read_text())
    perf = view["performance"]
    assert len(perf["rows"]) == 7 and perf["bandwidth"] and perf["compute"]
    columns = {"kernel", "kernel.bwd", "op", "op[advance]", "op.bwd", "subgraph", "framework"}
    assert set(perf["scopes"]) == {*columns, "memcpy"}  # update modes folded into their scope
    charts = {(c["kind"], c["title"].split(":")[0]) for c in perf["charts"]}
    # three lengths of fwd_bwd: time vs bytes and backward time vs tiles (T=16: 1, 2, 4 tiles);
    # the forward sweep has only two lengths: no chart
    assert charts == {("bytes", "fwd_bwd_length"), ("tiles", "fwd_bwd_length")}
    tiles = next(c for c in perf["charts"] if c["kind"] == "tiles")
    assert tiles["x"] == [1.0, 2.0, 4.0]
    assert {s["scope"] for s in tiles["series"]} == {"kernel.bwd", "op.bwd"}
    bytes_chart = next(c for c in perf["charts"] if c["kind"] == "bytes")
    assert all(s["slope"] is not None for s in bytes_chart["series"])
    html = (report / f"run-{first}.html").read_text()
    charts_html = html.split('id="timing-charts"', 1)[1].split("</div>", 1)[0]
    assert charts_html.count("<svg") == 2
    assert 'id="scope-table"' in html and 'id="rates"' in html


def _diff(url, tmp, base, head, *extra):
    out = tmp / f"diff-{base}-{head}.html"
    args = ["diff", str(base), str(head), "--db", url, "--out", str(out)]
    done = run(convmatrix_cmd(*args, "--fail-on", "timing-regression", *extra), tmp)
    return done, json.loads(out.with_suffix(".json").read_text())


def test_aa_diff_reports_no_timing_regression(perf_runs):
    url, tmp, (first, second, _) = perf_runs
    done, view = _diff(url, tmp, first, second)
    assert done.returncode == 0, done.stdout + done.stderr
    assert view["timing"]["regressions"] == [] and view["timing"]["pooled"]["slower"] is False
    assert "timing regressions: 0" in done.stdout


def test_slowed_kernel_diff_reports_the_regression(perf_runs):
    url, tmp, (first, _, slowed) = perf_runs
    # Raw times: Busy's spun CPU time is exact, and dividing it by the torch control (whose
    # CPU time moves ~15% between runs) would only add the control's noise to this kernel.
    done, view = _diff(url, tmp, first, slowed, "--timing-control", "none")
    assert done.returncode == 1, done.stdout + done.stderr
    timing, why = view["timing"], done.stdout
    assert timing["pooled"]["slower"] is True and timing["pooled"]["n_cases"] == 7, why
    claimed = {(c["case_id"], c["scope"], c["mode"]) for c in timing["regressions"]}
    compared = len(claimed) + timing["unchanged"] + len(timing["within_noise"])
    assert len(claimed) >= compared // 2, why  # most timings of a uniformly slower kernel
    # 1.5 by construction; one timing's ratio also carries its unslowed share (harness,
    # timer) and the noise of the torch path inside Busy, the median over cases hardly any.
    assert 1.3 < timing["pooled"]["ratio"] < 1.7, why
    assert not any(c["scope"] in ("framework", "memcpy", "fma") for c in timing["regressions"])
    assert "failing on timing-regression" in done.stdout


def test_builtin_perf_matrix_times_the_tiled_kernel(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    args = ["run", "--matrix", "perf", "--kernel", "tiled", "-n", "1", "--db", url]
    wanted = ["abd25491e61c", "8751f87beac3"]  # fwd L=1 and a one-token decode step
    done = run(convmatrix_cmd(*args, *[x for c in wanted for x in ("--case", c)]), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = runs(url)
    stored = results(url, info.id)
    assert sorted(r.case.id for r in stored) == sorted(wanted)
    for r in stored:
        scopes = {t.scope for t in r.timings}
        assert {"kernel", "op", "subgraph"} <= scopes
        assert all(t.efficiency is not None for t in r.timings if t.scope in ("kernel", "op"))


def _nightly(url: str, factors: list[float]) -> None:
    """One stored run per factor: two cases whose op (and framework control) are timed; case
    0's op is ``factor`` times slower, each sample within 3% of its centre."""
    rng = random.Random(0)

    def timing(scope: str, centre: float) -> TimingResult:
        s = sorted(centre * (1 + 0.03 * rng.random()) for _ in range(8))
        return TimingResult(scope=scope, median_s=s[4], min_s=s[0], iqr_s=0.0, n=8, samples=s)

    engine = open_database(url)
    for night, factor in enumerate(factors):
        with ResultWriter(engine) as writer:
            writer.start_run(fake_meta(label=f"night-{night}"))
            for i in range(2):
                times = [timing("op", 1e-3 * (1 + i) * (factor if i == 0 else 1.0)),
                         timing("framework", 1e-3)]  # fmt: skip
                writer.add(CaseResult(case=fake_case(i), outcome="passed", timings=times))
            writer.finish_run()
    engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize(
    "factors, claimed", [([1] * 5 + [1.5] * 3, 1), ([1] * 5 + [1.5] * 2 + [1], 0)]
)
def test_nightly_history_claims_only_a_confirmed_slowdown(db_url, tmp_path, factors, claimed):
    _nightly(db_url, factors)
    out = tmp_path / "diff.html"
    args = ["diff", "--previous", "latest", "--timing-history", "5", "--db", db_url]
    done = run(convmatrix_cmd(*args, "--out", str(out), "--fail-on", "timing-history"), tmp_path)
    assert done.returncode == claimed, done.stdout + done.stderr
    history = json.loads(out.with_suffix(".json").read_text())["timing_history"]
    assert len(history["regressions"]) == claimed and history["judged"] == 2
    assert len(history["baseline_runs"]) == 5 and len(history["recent_runs"]) == 3
    if claimed:
        assert history["regressions"][0]["case_id"] == fake_case(0).id
        assert "SLOWER SINCE" in done.stdout


def test_timing_history_needs_enough_runs(perf_runs):
    url, tmp, (first, second, _) = perf_runs
    args = ["diff", str(first), str(second), "--db", url, "--timing-history", "2"]
    done = run(convmatrix_cmd(*args), tmp)
    assert done.returncode == 2 and "--timing-history needs at least 3 runs" in done.stderr
