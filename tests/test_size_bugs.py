"""Seeded bugs that show only past a size (``seeded.size_bugs``).

Each bug must pass a case exactly at its declared threshold and fail the case one past it,
with shapes built from the bug's own ``Threshold`` (never retyped here), through the real
case runner; ``tiled`` passes both. They are a catalogue of their own: the main catalogue,
which ``nightly`` kills whole, is unchanged.
"""

from __future__ import annotations

import json

import pytest
import torch

from convmatrix.cli import main
from convmatrix.core.case import Case
from convmatrix.kernels.doubles.seeded import (
    CATALOGUE,
    CATALOGUES,
    SIZE_CATALOGUE,
    Threshold,
    base_case,
    load,
)
from convmatrix.kernels.interface.registry import load as load_kernel
from convmatrix.runners.case.execute import Context, run_case

BASE = Context(kernel=load_kernel("tiled"))


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def case_at(bug_name: str, threshold: Threshold, value: int) -> Case | None:
    """The bug's trigger case reshaped so that ``threshold.of(case) == value``: seqlen takes
    the largest divisor of ``value`` up to two time tiles (the tile loop stays short), the
    channels (else the batch) the rest (at most 2^18: a case of about 1 GB), the
    others 1. None when ``value`` has no such shape."""
    names = threshold.quantity.split("*")
    fields = dict.fromkeys(names, 1)
    if "seqlen" in names and len(names) > 1:
        fields["seqlen"] = max(d for d in range(1, 129) if value % d == 0)
        rest = value // fields["seqlen"]
        if rest > 2**18:
            return None
        fields["dim" if "dim" in names else "batch"] = rest
    else:
        fields[names[0]] = value
    case = base_case({**SIZE_CATALOGUE[bug_name].bug.trigger, **fields})
    assert threshold.of(case) == value
    return case


def first_past(bug_name: str, threshold: Threshold) -> Case:
    """The case of the smallest quantity past the limit that has a shape (``case_at``):
    limit + 1 for a single field; 2^24 + 2 elements factor only into 2796203 channels or a
    2796203-token row (gigabytes, or minutes of the tile loop), so the elements bug takes
    the first count after it that factors into a short row (2^24 + 6 = 77 x 217886)."""
    for value in range(threshold.limit + 1, threshold.limit + 64):
        case = case_at(bug_name, threshold, value)
        if case is not None:
            return case
    raise AssertionError(f"no cheap shape just past {threshold}")


def test_size_bugs_are_a_catalogue_of_their_own():
    assert len(SIZE_CATALOGUE) == 4 and not set(SIZE_CATALOGUE) & set(CATALOGUE)
    assert CATALOGUES["main"] is CATALOGUE and set(CATALOGUES["all"]) == {
        *CATALOGUE, *SIZE_CATALOGUE
    }  # fmt: skip
    quantities = {cls.bug.threshold.quantity for cls in SIZE_CATALOGUE.values()}
    assert quantities == {"batch*dim*seqlen", "batch*seqlen", "dim", "seqlen"}
    assert all(cls.bug.threshold is None for cls in CATALOGUE.values())
    assert load("seeded:channel_blocks_1024").name == "seeded:channel_blocks_1024"


@pytest.mark.parametrize("name", list(SIZE_CATALOGUE))
def test_passes_at_its_threshold_and_fails_one_past_it(name):
    threshold = SIZE_CATALOGUE[name].bug.threshold
    seeded = Context(kernel=load(name))
    at = case_at(name, threshold, threshold.limit)
    past = first_past(name, threshold)
    assert at is not None and threshold.of(past) - threshold.limit <= 8
    assert run_case(past, BASE).outcome == "passed"
    held = run_case(at, seeded)
    assert held.outcome == "passed", (held.message, held.outputs)
    broke = run_case(past, seeded)
    assert broke.outcome == "failed", broke.message


@pytest.mark.parametrize("name", list(SIZE_CATALOGUE))
def test_declared_trigger_and_quiet_cases(name):
    bug = SIZE_CATALOGUE[name].bug
    trigger, quiet = base_case(bug.trigger), base_case(bug.quiet)
    assert bug.threshold.of(quiet) <= bug.threshold.limit < bug.threshold.of(trigger)
    seeded = Context(kernel=load(name))
    assert run_case(trigger, seeded).outcome == "failed"
    assert run_case(quiet, seeded).outcome == "passed"


SIZED = """name: sized
seed: 0
suites:
  fwd_bwd:
    op: fwd_bwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [8]
      dim: [8]
      batch: [1]
    include:
      - {seqlen: 4097, batch: 2}
      - {dim: 1025}
"""


def test_adequacy_measures_a_matrix_against_the_size_catalogue(tmp_path, capsys):
    matrix = tmp_path / "sized.yaml"
    matrix.write_text(SIZED)
    db = f"sqlite:///{tmp_path / 'a.db'}"
    argv = ["adequacy", "--matrix", str(matrix), "--catalogue", "size", "-n", "1", "--db", db,
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 1  # no case reaches 2^24 elements
    view = json.loads((tmp_path / "adequacy-sized.json").read_text())
    assert view["total"] == len(SIZE_CATALOGUE) and view["killed"] == len(SIZE_CATALOGUE) - 1
    assert [b["name"] for b in view["survivors"]] == ["flat_index_fp32"]
    out = capsys.readouterr().out
    assert "survivor flat_index_fp32 (meant for size)" in out
    with pytest.raises(SystemExit) as exited:
        main(["adequacy", "--matrix", str(matrix), "--catalogue", "huge", "--db", db])
    assert exited.value.code == 2
    assert "--catalogue: invalid choice: 'huge'" in capsys.readouterr().err
