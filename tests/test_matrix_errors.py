"""Malformed matrices: each kind gives one clear message naming file:line:col and the key
path, exit status 2, and never a traceback. Driven through the real CLI entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from convmatrix.cli import main
from convmatrix.matrix import MatrixError, load_matrix

BAD = Path(__file__).parent / "resources" / "matrices"

# fixture -> (line, col, key path, words the message must contain)
CASES = {
    "bad_syntax": (6, 13, "(syntax)", "invalid YAML"),
    "bad_top_key": (1, 1, "suits", "did you mean 'suites'"),
    "bad_suite_key": (4, 5, "suites.fwd.dimensons", "did you mean 'dimensions'"),
    "bad_dimension_name": (6, 7, "suites.fwd.dimensions.seqlne", "did you mean 'seqlen'"),
    "bad_type": (5, 18, "suites.fwd.dimensions.width[1]", "positive integer, got 'three'"),
    "bad_dtype": (8, 26, "suites.fwd.dimensions.x_dtype[1]", "did you mean 'bfloat16'"),
    "bad_empty_dimension": (8, 14, "suites.fwd.dimensions.batch", "empty dimension"),
    "bad_unresolved_symbol": (7, 19, "suites.fwd.dimensions.seqlen[1]", "declares no 'tile'"),
    "bad_unknown_symbol": (7, 16, "suites.fwd.dimensions.seqlen[0]", "did you mean 'tile'"),
    "bad_contradicting_rules": (
        8,
        31,
        "suites.fwd.dimensions.layout[1]",
        "no valid case has layout=channel_last",
    ),
    "bad_include_excluded": (11, 9, "suites.fwd.include[0]", "contradicts the rules"),
    "bad_expands_to_nothing": (3, 5, "suites.fwd", "expands to no case"),
    "bad_python_tag": (5, 14, "suites.fwd.dimensions.width", "not allowed"),
    "bad_duplicate_key": (7, 7, "suites.fwd.dimensions.width", "duplicate key (first at line 5)"),
    "bad_dimension_for_op": (8, 7, "suites.fwd.dimensions.dfinal", "does not apply to op 'fwd'"),
    "bad_strategy": (4, 15, "suites.fwd.strategy", "did you mean 'pairwise'"),
    "bad_strategy_param": (4, 32, "suites.fwd.strategy.t", "takes no parameter 't'"),
    "bad_missing_dimension": (5, 7, "suites.upd.dimensions", "missing required dimension 'tokens'"),
    "bad_tolerance_output": (3, 5, "tolerances.bfloat16.dW", "did you mean 'dw'"),
    "bad_rule_value": (10, 18, "suites.fwd.exclude[0].layout", "did you mean 'channel_last'"),
    "bad_packing": (8, 22, "suites.fwd.dimensions.packed[1]", "not strictly inside"),
    "bad_empty": (1, 1, "(document)", "empty"),
    "bad_expression": (7, 16, "suites.fwd.dimensions.seqlen[0]", "use '//'"),
    "bad_policy": (1, 16, "policy.mode", "did you mean 'threshold'"),
    "bad_not_mapping": (1, 1, "(document)", "must be a mapping"),
    "bad_timeout": (1, 12, "timeout_s", "must be > 0"),
}


def test_every_fixture_has_an_expectation():
    assert {p.stem for p in BAD.glob("bad_*.yaml")} == set(CASES)
    assert len(CASES) >= 15


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_matrix_gives_one_clear_error(name, capsys):
    line, col, key_path, words = CASES[name]
    path = BAD / f"{name}.yaml"
    status = main(["expand", str(path)])
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one message
    assert f"{path}:{line}:{col}: {key_path}: " in err
    assert words in err


def test_error_fields_are_structured():
    with pytest.raises(MatrixError) as info:
        load_matrix(str(BAD / "bad_dimension_name.yaml"))
    exc = info.value
    assert (exc.line, exc.col, exc.path) == (6, 7, "suites.fwd.dimensions.seqlne")
    assert exc.exit_code == 2


def test_unknown_builtin_name_suggests_the_closest():
    with pytest.raises(MatrixError, match="did you mean 'nightly'"):
        load_matrix("nightli")


def test_python_tag_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    matrix = tmp_path / "evil.yaml"
    matrix.write_text(
        f'suites: !!python/object/apply:os.system ["touch {marker}"]\n', encoding="utf-8"
    )
    assert main(["expand", str(matrix)]) == 2
    assert not marker.exists()


def test_process_exit_status_and_no_traceback():
    """The installed entry point itself: exit 2 and a single line on stderr."""
    path = BAD / "bad_dtype.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "convmatrix", "expand", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"convmatrix expand: error: {path}:8:26: ")
