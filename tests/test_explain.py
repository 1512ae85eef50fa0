"""Explanations that say what they know (``reports.explain``, ``reports.facts``): nothing from
fewer than three failing cases, facts of the call (dy, x or the state reaching the kernel
contiguous, the first sequence against K-1, L against the declared tile) as candidates beside
the matrix dimensions, the alert page showing its top candidate's support, and an alert's
explanation computed from all its cases whenever they change."""

from __future__ import annotations

import itertools
import warnings

from reports_support import GEOMETRY, cases, synthetic_results, write_run

from convmatrix.compare.findings import Finding
from convmatrix.core.case import Case
from convmatrix.db import load_results, open_database
from convmatrix.db.engine import write_session
from convmatrix.db.models import AlertRow
from convmatrix.db.queries import resolve_run
from convmatrix.reports.explain import MIN_FAILING, explain
from convmatrix.service.alerts import refresh_explanation
from convmatrix.service.regressions import set_state
from convmatrix.service.scan import file_findings, scan_run

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app


def _grid() -> list[Case]:
    """fwd_bwd cases over dy's layout, packing, length and x's layout (96)."""
    out = []
    product = itertools.product(
        (None, "gapped", "expanded"), (None, (2, 14), (9, 7)), (16, 40), ("channel_first",
        "channel_last"), (8, 24), (1, 2),
    )  # fmt: skip
    for grad, packed, length, layout, dim, batch in product:
        seq_lens = None if packed is None else tuple(n * length // 16 for n in packed)
        out.append(Case("g", "fwd_bwd", 4, dim, batch, seqlen=length, layout=layout,
                        grad_layout=grad, seq_lens=seq_lens))  # fmt: skip
    return out


def test_fewer_than_three_failing_cases_explain_nothing_and_say_so():
    grid = _grid()
    two = [grid[0].id, grid[7].id]
    (said,) = explain(grid, two)
    assert said.dimensions == () and said.failing == 2 == MIN_FAILING - 1
    assert said.text() == "too few cases to explain: 2 failing (at least 3 needed)"
    assert explain(grid, [*two, grid[11].id])[0].dimensions  # three: an explanation
    assert explain(grid, []) == [] and explain(grid, [c.id for c in grid]) == []


def test_a_fact_of_the_call_no_dimension_carries_explains_a_dy_layout_bug():
    """fla PR #871: dS wrong when dy reached the kernel strided. No matrix dimension of the
    report says so (``grad_layout`` is not one); the fact does, exactly."""
    grid = _grid()
    failing = [c.id for c in grid if c.grad_layout is not None]
    best = explain(grid, failing)[0]
    assert best.dimensions == ("dy contiguity",) and best.values == ("dy strided",)
    assert (best.failing_in, best.failing, best.passing_in) == (len(failing), len(failing), 0)


def test_the_first_sequence_against_k_minus_1_and_l_against_the_tile():
    grid = _grid()
    short_first = [c.id for c in grid if c.seq_lens and c.seq_lens[0] < 3]  # (2*L/16, ...)
    best = explain(grid, short_first)[0]
    assert (best.dimensions, best.values) == (("first sequence",), ("first seq < K-1",))
    geometry = {"time_tile": 16}
    partial = [c.id for c in grid if c.seqlen % 16]  # 40: two tiles and a partial one
    by_tile = [e for e in explain(grid, partial, geometry, limit=5) if e.dimensions == (
        "L vs tile",)]  # fmt: skip
    assert by_tile and by_tile[0].values == ("L > tile, partial tile",)
    assert by_tile[0].score == 1.0


def _scanned(url: str, n: int, broken: set[str]) -> tuple[object, int]:
    """A good run and one breaking ``broken``, scanned: (engine, the scan)."""
    engine = open_database(url)
    write_run(engine, synthetic_results(n, extras=False), commit="1" * 40)
    bad = write_run(engine, synthetic_results(n, bug=lambda c: c.id in broken, extras=False),
                    commit="2" * 40)  # fmt: skip
    with write_session(engine) as session:
        return engine, scan_run(session, bad)


def test_an_alert_page_shows_the_support_of_its_top_candidate(sqlite_url):
    n = 60
    tail = {c.id for c in cases(n) if c.seqlen == GEOMETRY["time_tile"] + 1}
    assert len(tail) >= MIN_FAILING
    engine, found = _scanned(sqlite_url, n, tail)
    with TestClient(create_app(sqlite_url)) as client:
        view = client.get(f"/api/alerts/{found.alert_id}").json()
        html = client.get(f"/alerts/{found.alert_id}").text
    top = view["alert"]["explanation"][0]
    assert top["dimensions"] == ["seqlen"] and top["values"] == ["tile+1"]
    assert (top["failing_in"], top["failing"], top["passing_in"]) == (len(tail), len(tail), 0)
    for field in ("failing_in", "failing", "passing_in", "passing"):
        assert f'data-support="{field}">{top[field]}<' in html
    engine.dispose()


def test_an_alert_of_two_cases_says_too_few_and_is_explained_again_from_all_its_cases(
    sqlite_url,
):
    n = 60
    tail = [c.id for c in cases(n) if c.seqlen == GEOMETRY["time_tile"] + 1]
    engine, scan = _scanned(sqlite_url, n, set(tail[:2]))
    assert scan.explanation == ["too few cases to explain: 2 failing (at least 3 needed)"]
    with TestClient(create_app(sqlite_url)) as client:
        html = client.get(f"/alerts/{scan.alert_id}").text
    assert "too few cases to explain: 2 failing" in html and 'id="support"' not in html
    # The alert gains cases (a confirmation files those it reproduced): its explanation is
    # computed again from every case it holds.
    with write_session(engine) as session:
        run = resolve_run(session, scan.run_id)
        more = [Finding(cid, cid, "new_failure", "timeout -> failed") for cid in tail[2:]]
        filed = file_findings(session, run, more, f"not judged in run {run.id}")
        alert = session.get(AlertRow, scan.alert_id)
        best = alert.explanation[0]
        assert (best["dimensions"], best["failing"]) == (["seqlen"], len(tail))
        # A regression found flaky is not the cause: left out when explained again.
        set_state(session, filed[0].id, "flaky", by="confirm", note="did not reproduce")
        refresh_explanation(session, alert, load_results(session, run.id), run.geometry)
        assert alert.explanation[0]["failing"] == len(tail) - 1
    engine.dispose()


def test_contiguity_facts_come_from_the_layout_the_runners_build():
    """The explanation's facts of the call hold to the tensors ``runners.case.inputs`` builds."""
    from convmatrix.reports.facts import FACTS
    from convmatrix.runners.case.inputs import build_forward

    variants = [
        dict(layout="channel_first"), dict(layout="channel_last"),
        dict(layout="channel_first", gap="row_pad"), dict(grad_layout="gapped"),
        dict(grad_layout="expanded"), dict(initial_state="random", layout="channel_last"),
        dict(initial_state="random"),
    ]  # fmt: skip
    for extra in variants:
        case = Case("t", "fwd_bwd", 4, 6, 2, seqlen=9, **extra)
        built = build_forward(case, "cpu")
        dy = built.g if built.g_view is None else built.g_view
        assert FACTS["x contiguity"](case, None) == (
            "x contiguous" if built.x.view.is_contiguous() else "x strided"
        ), extra
        assert FACTS["dy contiguity"](case, None) == (
            "dy contiguous" if dy.is_contiguous() else "dy strided"
        ), extra
        state = built.initial_state
        want = "no state" if state is None else (
            "state contiguous" if state.view.is_contiguous() else "state strided"
        )  # fmt: skip
        assert FACTS["state contiguity"](case, None) == want, extra
