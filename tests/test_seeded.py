"""Seeded-bug kernels and ``convmatrix adequacy``.

Every seeded kernel is run by the real case runner (``run_case``: inputs with NaN guards, the
float64 reference, the framework path, property checks, the verdict) on its own trigger case,
which it must fail while ``tiled`` passes it, and on a case where its bug cannot show, which it
must pass. The command runs end to end through the CLI on a real SQLite file: the kill matrix
in the terminal, the JSON and the HTML (in headless Chromium when present), one run per bug
in the database, and the ``--minimize`` round trip (the written matrix kills the same bugs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import test_browser
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.core.case import Case
from convmatrix.db import open_database
from convmatrix.db.models import Run
from convmatrix.kernels.builtin.tiled import TiledKernel
from convmatrix.kernels.doubles.seeded import CATALOGUE, DIMENSIONS, base_case
from convmatrix.kernels.interface.registry import KernelSpecError, load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.matrix.errors import MatrixError
from convmatrix.reports.adequacy import AdequacyRow, minimize
from convmatrix.runners.case.execute import Context, run_case

BASE = Context(kernel=TiledKernel())
# the Chromium fixtures
browser, open_url, open_page = test_browser.browser, test_browser.open_url, test_browser.open_page

# The bug classes issue 13 names, each with the seeded kernel that carries it.
REQUIRED = (
    "taps_reversed", "halo_off_by_one", "tail_tile_dropped", "vec_tail_dropped",
    "ctile_tail_dropped", "shape_as_stride", "initial_state_reversed",
    "final_state_short_chunk", "dF_ignored", "dw_batch_unreduced", "dw_groups_unreduced",
    "dw_tiles_unreduced", "silu_derivative_wrong", "bias_after_silu", "packed_boundary_leak",
    "padding_outputs", "padding_grad_leak", "initial_state_every_sequence", "ring_no_modulo",
    "slot_index_ignored", "pad_slot_written", "neighbour_row_touched", "channel_last_strides",
    "half_products", "state_write_past_end", "dy_contiguous_assumed", "x_cast_to_weight_dtype",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def test_catalogue_covers_the_issue_and_cites_upstream():
    assert len(CATALOGUE) >= 35
    assert set(REQUIRED) <= set(CATALOGUE)
    upstream = [cls for cls in CATALOGUE.values() if cls.bug.source != "seed table"]
    assert len(upstream) >= 15
    for name, cls in CATALOGUE.items():
        bug = cls.bug
        assert bug.name == name and bug.dimension in DIMENSIONS and bug.reach
        doc = " ".join((cls.__doc__ or "").split())
        if bug.source != "seed table":  # the docstring names the issue or commit it cites
            ref = bug.source.split()[-1].lstrip("#")
            assert ref in doc, (name, bug.source)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_trigger_kills_and_quiet_case_passes(name):
    cls = CATALOGUE[name]
    seeded = Context(kernel=cls())
    trigger = base_case(cls.bug.trigger)
    assert run_case(trigger, BASE).outcome == "passed"
    got = run_case(trigger, seeded)
    assert got.outcome == "failed", (name, got.message)
    if cls.bug.quiet is not None:
        quiet = base_case(cls.bug.quiet)
        result = run_case(quiet, seeded)
        assert result.outcome == "passed", (name, result.message, result.outputs)


def test_seeded_specs():
    kernel = load("seeded:taps_reversed")
    assert kernel.name == "seeded:taps_reversed" and isinstance(kernel, TiledKernel)
    with pytest.raises(KernelSpecError, match="did you mean 'taps_reversed'"):
        load("seeded:taps_reverse")


def test_kernels_lists_seeded(capsys):
    assert main(["kernels", "--seeded"]) == 0
    out = capsys.readouterr().out
    assert "seeded:dF_ignored" in out and f"{len(CATALOGUE)} seeded bugs" in out
    assert main(["kernels"]) == 0
    assert "seeded:" not in capsys.readouterr().out


def test_grad_layout_is_late_and_keeps_ids():
    plain = base_case({})
    assert "grad_layout" not in plain.canonical()
    gapped = base_case({"grad_layout": "gapped"})
    assert gapped.id != plain.id and "dygapped" in gapped.pytest_id
    # A pairwise suite that does not name it draws exactly what it drew before.
    cases = expand_matrix(load_matrix("smoke"), TiledKernel()).cases
    assert all(c.grad_layout is None for c in cases)


def test_expanded_and_gapped_dy_pass_on_tiled():
    for layout in ("gapped", "expanded"):
        case = base_case({"grad_layout": layout, "activation": "silu", "batch": 2})
        assert run_case(case, BASE).outcome == "passed"


def _matrix(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\n"
        "seed: 0\n"
        "suites:\n"
        "  fwd_bwd:\n"
        "    op: fwd_bwd\n"
        "    strategy: full\n"
        "    dimensions:\n"
        "      width: [4]\n"
        "      seqlen: [8, tile+1]\n"
        "      dim: [vec+1]\n"
        "      batch: [1, 2]\n"
        "      activation: [none, silu]\n"
        "    include:\n"
        "      - {seqlen: 8, grad_layout: expanded}\n" + extra
    )
    return path


def test_cases_key_keeps_listed_cases(tmp_path):
    path = _matrix(tmp_path)
    ids = [c.id for c in expand_matrix(load_matrix(str(path)), TiledKernel()).cases]
    assert len(ids) == 9
    path.write_text(path.read_text() + f"cases: ['{ids[3]}', '{ids[0]}']\n")
    kept = expand_matrix(load_matrix(str(path)), TiledKernel()).cases
    assert [c.id for c in kept] == [ids[0], ids[3]]  # matrix order
    path.write_text(path.read_text().replace(ids[3], "0123456789ab"))
    where = r"tiny.yaml:15:9: cases\[0\]: case 0123456789ab is not a case"
    with pytest.raises(MatrixError, match=where):
        expand_matrix(load_matrix(str(path)), TiledKernel())
    path.write_text(path.read_text().replace("0123456789ab", "xyz"))
    with pytest.raises(MatrixError, match="12 lowercase hex digits"):
        load_matrix(str(path))


def test_minimize_is_a_cover_without_redundant_cases():
    rows = [
        AdequacyRow("a", "a", "s", ["b1", "b2"], [], 1.0),
        AdequacyRow("b", "b", "s", ["b2", "b3"], [], 1.0),
        AdequacyRow("c", "c", "s", ["b1", "b2", "b3"], [], 5.0),
        AdequacyRow("d", "d", "s", ["b4"], ["b4"], 0.1),
        AdequacyRow("e", "e", "s", [], [], 0.1),
    ]
    picked = minimize(rows)
    assert picked == ["c", "d"]  # greedy takes c (3 new bugs), then d; nothing is redundant
    killed = {b for r in rows if r.case_id in picked for b in r.kills}
    assert killed == {"b1", "b2", "b3", "b4"}


BUGS = "taps_reversed,dy_contiguous_assumed,halo_off_by_one,dw_batch_unreduced,ring_ignored"


def _adequacy(tmp_path: Path, matrix: Path, *extra: str) -> tuple[int, dict]:
    db = f"sqlite:///{tmp_path / 'adequacy.db'}"
    argv = ["adequacy", "--matrix", str(matrix), "--bugs", BUGS, "-n", "2", "--db", db]
    code = main([*argv, "--out", str(tmp_path / "out"), *extra])
    name = load_matrix(str(matrix)).name
    return code, json.loads((tmp_path / "out" / f"adequacy-{name}.json").read_text())


def test_adequacy_end_to_end_and_minimize_round_trip(tmp_path, capsys):
    code, view = _adequacy(tmp_path, _matrix(tmp_path), "--minimize")
    out = capsys.readouterr().out
    assert code == 1  # ring_ignored has no update case to reach it
    bugs = {b["name"]: b for b in view["bugs"]}
    assert [b["name"] for b in view["survivors"]] == ["ring_ignored"]
    assert "survivor ring_ignored (meant for update)" in out
    assert not bugs["ring_ignored"]["killed"] and bugs["taps_reversed"]["killed"]
    # dy_contiguous_assumed: only the expanded-dy include reaches it, through the gradients.
    [kill] = bugs["dy_contiguous_assumed"]["kills"]
    assert "dyexpanded" in kill["case"] and set(kill["how"]) <= {"dx", "dw", "db", "raised"}
    # halo_off_by_one: only the L = tile+1 cases.
    assert all("-L65-" in k["case"] for k in bugs["halo_off_by_one"]["kills"])
    assert bugs["dw_batch_unreduced"]["how"] == ["db", "dw"]
    assert view["killed"] == 4 and view["total"] == 5 and view["score"] == pytest.approx(0.8)
    assert "mutation score 4/5 = 80.0%" in out
    # Each bug is a kernel of its own in the run records, beside the base run.
    engine = open_database(f"sqlite:///{tmp_path / 'adequacy.db'}")
    with Session(engine) as session:
        kernels = sorted(session.scalars(select(Run.kernel)))
    engine.dispose()
    assert kernels == sorted(["tiled", *(f"seeded:{b}" for b in BUGS.split(","))])
    # Unique kills: a case is listed as the only killer of a bug exactly when it is.
    killers: dict[str, list[str]] = {}
    for case in view["cases"]:
        for bug in case["kills"]:
            killers.setdefault(bug, []).append(case["case_id"])
    for case in view["cases"]:
        assert case["unique"] == [b for b in case["kills"] if len(killers[b]) == 1]
    # The HTML carries the same numbers.
    html = (tmp_path / "out" / "adequacy-tiny.html").read_text()
    assert 'id="verdict">4/5 killed' in html
    assert len(re.findall(r'<tr data-bug="[^"]+" data-killed="true"', html)) == 4
    # --minimize: the written matrix keeps the case ids and kills the same bugs.
    mz = view["minimized"]
    written = Path(mz["path"])
    assert mz["cases"] == len(mz["case_ids"]) < len(view["cases"])
    spec = load_matrix(str(written))
    assert spec.name == "tiny-min"
    assert [c.id for c in expand_matrix(spec, TiledKernel()).cases] == mz["case_ids"]
    code, again = _adequacy(tmp_path, written)
    assert code == 1
    assert {b["name"] for b in again["bugs"] if b["killed"]} == {
        n for n, b in bugs.items() if b["killed"]
    }


def test_adequacy_refuses_a_failing_base(tmp_path, capsys):
    # An expected-error suite of valid cases: tiled returns normally, so it fails them.
    extra = (
        "  wrong:\n"
        "    op: fwd\n"
        "    expect: error\n"
        "    dimensions: {width: [4], seqlen: [8], dim: [8]}\n"
    )
    code = main(
        ["adequacy", "--matrix", str(_matrix(tmp_path, extra)), "--bugs", "taps_reversed",
         "-n", "1", "--db", f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "base kernel 'tiled' does not pass matrix tiny (1 failed" in err
    assert not (tmp_path / "adequacy-tiny.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bugs", "taps_reverse"], "unknown seeded bug 'taps_reverse' (did you mean"),
        (["--base", "torch"], "--base 'torch': the seeded bugs are variants of tiled"),
        (["--sample", "0"], "--sample 0: give a positive number"),
    ],
)
def test_adequacy_usage_errors(tmp_path, capsys, argv, message):
    db = f"sqlite:///{tmp_path / 'a.db'}"
    assert main(["adequacy", "--matrix", str(_matrix(tmp_path)), "--db", db, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_kills_the_whole_catalogue(tmp_path):
    """The whole catalogue through the smoke matrix (about 1.5 minutes on 2 cores)."""
    db = f"sqlite:///{tmp_path / 'smoke.db'}"
    argv = ["adequacy", "--matrix", "smoke", "-n", "2", "--db", db, "--out", str(tmp_path)]
    assert main(argv) == 0
    view = json.loads((tmp_path / "adequacy-smoke.json").read_text())
    assert view["killed"] == view["total"] == len(CATALOGUE)
    assert all(b["first_kill_s"] is not None for b in view["bugs"])


def test_base_case_defaults():
    case = base_case({"final_state": True})
    assert isinstance(case, Case) and case.dfinal == "zero" and case.op == "fwd_bwd"
    assert base_case({"op": "update"}).tokens == 1


@pytest.mark.browser
def test_adequacy_report_in_chromium(tmp_path, open_page):
    """The kill matrix page in headless Chromium: the numbers of its JSON, sorting works,
    no console error and no request but the page itself."""
    code, view = _adequacy(tmp_path, _matrix(tmp_path), "--minimize")
    assert code == 1
    opened = open_page(tmp_path / "out" / "adequacy-tiny.html")
    page = opened.page
    assert page.inner_text("#verdict") == f"{view['killed']}/{view['total']} killed"
    assert float(page.get_attribute("#score", "data-value")) == view["score"]
    assert page.locator("#survivors tbody tr").count() == len(view["survivors"]) == 1
    assert page.locator("#kill-matrix tbody tr").count() == len(view["bugs"])
    assert page.inner_text('[data-count="minimized"]') == str(view["minimized"]["cases"])
    table = "#kill-matrix table"
    page.click(f"{table} thead th:nth-child(6)")
    cells = page.eval_on_selector_all(
        f"{table} tbody td:nth-child(6)", "cells => cells.map(c => c.getAttribute('data-value'))"
    )
    kills = [float(v) for v in cells]
    assert kills == sorted(kills)
    opened.assert_clean()
