"""Malformed input: every member of a corpus of broken matrices and command lines is refused
with one line (naming file:line, key or argument) and exit 2, and changes no database.

The matrices are the ones a person (or a fuzzer) writes by mistake or malice: syntax, NUL,
size and nesting bombs, numbers the database cannot hold (literal or after symbols resolve),
NaN/inf limits, unknown keys and values. They go through ``convmatrix run`` in this process
(``convmatrix.cli.main``), so what is checked is the real command's exit status and output.
A hypothesis fuzz of the YAML loader asserts MatrixError or a valid spec, nothing else.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runner_helpers import KERNELS

from convmatrix.cli import main
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.matrix.errors import MatrixError
from convmatrix.matrix.schema import parse_matrix
from convmatrix.matrix.source import load_yaml

BASE = """\
name: base
geometry: {tile: 8, ctile: 8, vec: 4}
timeout_s: 30
suites:
  fwd:
    op: fwd
    strategy: full
    dimensions:
      width: [4]
      seqlen: [5]
      dim: [4]
      batch: [1]
"""


def _swap(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new)


def _nested(depth: int) -> str:
    return BASE + "description: " + "[" * depth + "]" * depth + "\n"


# name -> matrix text (bytes for the ones that are not text); every one must be refused
MATRICES: dict[str, str | bytes] = {
    "empty": "",
    "comment_only": "# nothing\n",
    "nul_in_text": BASE.replace("name: base", "name: ba\x00se"),
    "nul_in_comment": BASE + "# \x00\n",
    "not_utf8": BASE.encode() + b"# \xff\xfe\n",
    "tab_indent": BASE.replace("  fwd:", "\tfwd:"),
    "unclosed_bracket": _swap("width: [4]", "width: [4"),
    "top_is_list": "- a\n- b\n",
    "top_is_scalar": "42\n",
    "too_big": BASE + "# " + "x" * (1 << 20) + "\n",
    "nested_5000": _nested(5000),
    "nested_40": _nested(40),
    "python_tag": BASE + "description: !!python/object/apply:os.system ['true']\n",
    "custom_tag": BASE + "description: !foo bar\n",
    "alias_bomb": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + BASE,
    "duplicate_key": BASE + "timeout_s: 40\n",
    "unknown_top_key": BASE + "colour: blue\n",
    "no_suites": "name: x\n",
    "suites_empty": "suites: {}\n",
    "suites_list": "suites: [a, b]\n",
    "bad_name": _swap("name: base", "name: 'bad name!'"),
    "seed_negative": BASE + "seed: -1\n",
    "seed_huge": BASE + "seed: 1099511627776\n",
    "seed_float": BASE + "seed: 1.5\n",
    "timeout_nan": _swap("timeout_s: 30", "timeout_s: .nan"),
    "timeout_inf": _swap("timeout_s: 30", "timeout_s: .inf"),
    "timeout_negative": _swap("timeout_s: 30", "timeout_s: -1"),
    "timeout_zero": _swap("timeout_s: 30", "timeout_s: 0"),
    "timeout_string": _swap("timeout_s: 30", "timeout_s: soon"),
    "budget_zero": BASE + "memory_budget_mb: 0\n",
    "budget_nan": BASE + "memory_budget_mb: .nan\n",
    "geometry_unknown": _swap("vec: 4}", "vec: 4, warp: 32}"),
    "geometry_zero": _swap("tile: 8,", "tile: 0,"),
    "geometry_huge": _swap("tile: 8,", "tile: 9223372036854775808,"),
    "tolerance_nan": BASE + "tolerances: {float32: {y: {rel: .nan}}}\n",
    "tolerance_inf": BASE + "tolerances: {float32: {y: {norm: .inf}}}\n",
    "tolerance_negative": BASE + "tolerances: {float32: {y: {rel: -1}}}\n",
    "tolerance_dtype": BASE + "tolerances: {float33: {y: {rel: 1}}}\n",
    "tolerance_output": BASE + "tolerances: {float32: {z: {rel: 1}}}\n",
    "policy_mode": BASE + "policy: {mode: lenient}\n",
    "policy_factor_zero": BASE + "policy: {factor: 0}\n",
    "policy_floor_nan": BASE + "policy: {floor: .nan}\n",
    "suite_key": _swap("    strategy: full", "    strategy: full\n    colour: red"),
    "suite_name": _swap("  fwd:", "  'f w d':"),
    "op_unknown": _swap("op: fwd", "op: sideways"),
    "strategy_unknown": _swap("strategy: full", "strategy: every"),
    "dimension_unknown": _swap("batch: [1]", "batch: [1]\n      colour: [red]"),
    "dimension_empty": _swap("batch: [1]", "batch: []"),
    "width_zero": _swap("width: [4]", "width: [0]"),
    "width_text": _swap("width: [4]", "width: [four]"),
    "width_huge": _swap("width: [4]", "width: [4294967296]"),
    "seqlen_2_63": _swap("seqlen: [5]", "seqlen: [9223372036854775809]"),
    "seqlen_1e12": _swap("seqlen: [5]", "seqlen: [1000000000000]"),
    "seqlen_float": _swap("seqlen: [5]", "seqlen: [5.5]"),
    "seqlen_expr_huge": _swap("seqlen: [5]", "seqlen: ['4294967296*4294967296']"),
    "seqlen_symbol_product": _swap(
        "seqlen: [5]", "seqlen: ['tile*tile*tile*tile*tile*tile*tile*tile*tile*tile*tile']"
    ),
    "seqlen_unknown_symbol": _swap("seqlen: [5]", "seqlen: ['warp+1']"),
    "batch_1e9": _swap("batch: [1]", "batch: [1000000000]"),
    "size_product": _swap("dim: [4]", "dim: [65536]").replace("seqlen: [5]", "seqlen: [65536]"),
    "dim_text": _swap("dim: [4]", "dim: [lots]"),
    "dtype_unknown": _swap("batch: [1]", "batch: [1]\n      dtype: [float33]"),
    "layout_unknown": _swap("batch: [1]", "batch: [1]\n      layout: [diagonal]"),
    "checks_unknown": _swap("    strategy: full", "    strategy: full\n    checks: [psychic]"),
    "dimensions_list": _swap("    dimensions:", "    dimensions: [1]\n    unused:"),
}


def _db_state(path: Path) -> tuple[bool, str | None, set[str]]:
    """(exists, content hash, the files beside it): what a refused command must not change.
    The WAL files of the convmatrix database come and go with any reader; not of the others."""
    siblings = {p.name for p in path.parent.iterdir() if not p.name.startswith("results.db-")}
    if not path.exists():
        return False, None, siblings
    return True, hashlib.sha256(path.read_bytes()).hexdigest(), siblings


def _refused(argv: list[str], capsys) -> str:
    """Run the CLI; assert exit 2 and one line on stderr (no traceback); that line. A run
    that names no stored run may list the candidates under it, one indented line each."""
    code = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, (argv, captured.out[-2000:], captured.err[-2000:])
    assert lines and " error: " in lines[0], captured.err[-3000:]
    assert all(line.startswith("  run ") for line in lines[1:]), captured.err[-3000:]
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_every_malformed_matrix_is_one_line_and_exit_2(name, tmp_path, capsys):
    text = MATRICES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    db = tmp_path / "results.db"
    argv = ["run", "--matrix", str(path), "--kernel", "torch", "-n", "0", "--db", f"sqlite:///{db}"]
    line = _refused(argv, capsys)
    assert str(path) in line, line  # names the file (and line:col where there is one)
    assert not db.exists(), "a refused run created its database"


def test_the_base_matrix_is_valid(tmp_path):
    """The corpus's refusals are the mutations', not the base's."""
    path = tmp_path / "base.yaml"
    path.write_text(BASE)
    assert len(expand_matrix(load_matrix(str(path))).cases) == 1


@pytest.fixture
def convmatrix_db(tmp_path) -> Path:
    """A real convmatrix database holding one run (copied from a tiny --no-db-free run)."""
    path = tmp_path / "results.db"
    matrix = tmp_path / "one.yaml"
    matrix.write_text(BASE)
    assert main(["run", "--matrix", str(matrix), "--kernel", "torch", "-n", "0",
                 "--db", f"sqlite:///{path}"]) == 0  # fmt: skip
    return path


def _cli_cases(tmp: Path, db: Path) -> list[tuple[list[str], str]]:
    """(argv, words of the one line) of the command-line corpus; ``db`` an existing database."""
    url = f"sqlite:///{db}"
    foreign = tmp / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (x)")
    garbage = tmp / "garbage.db"
    garbage.write_bytes(b"this is not a database\x00" * 100)
    missing = f"sqlite:///{tmp / 'missing.db'}"
    run = ["run", "--matrix", "smoke", "-n", "0"]
    return [
        ([*run, "--kernel", "os:system", "--db", url], "is not a kernel"),
        ([*run, "--kernel", "os:abort", "--db", url], "is not a kernel"),
        ([*run, "--kernel", "json:loads", "--db", url], "is not a kernel"),
        ([*run, "--kernel", "nope", "--db", url], "unknown kernel"),
        ([*run, "--kernel", "fault_kernels:LongName", "--db", url], "1 to 200 characters"),
        ([*run, "--kernel", "torch", "--db", f"sqlite:///file:{db}?mode=ro&uri=true"], "readonly"),
        ([*run, "--kernel", "nosuchmodule:K", "--db", url], "cannot import"),
        ([*run, "--kernel", "torch", "--case-timeout", "nan", "--db", url], "--case-timeout"),
        ([*run, "--kernel", "torch", "--case-timeout", "-1", "--db", url], "--case-timeout"),
        ([*run, "--kernel", "torch", "--case-timeout", "0", "--db", url], "--case-timeout"),
        ([*run, "--kernel", "torch", "--case-timeout", "inf", "--db", url], "--case-timeout"),
        ([*run, "--kernel", "torch", "--label", "x" * 300, "--db", url], "--label"),
        ([*run, "--kernel", "torch", "--db", "sqlite:////proc/nope/x.db"], "cannot create"),
        ([*run, "--kernel", "torch", "--db", "not a url"], "not a database URL"),
        ([*run, "--kernel", "torch", "--db", f"sqlite:///{foreign}"], "not a convmatrix"),
        ([*run, "--kernel", "torch", "--db", f"sqlite:///{garbage}"], "not a usable SQLite"),
        ([*run, "--kernel", "torch", "--resume", "999", "--db", missing], "does not exist"),
        ([*run, "--kernel", "torch", "--resume", "999", "--db", url], "999"),
        ([*run, "--kernel", "torch", "--case", "zzzz", "--db", url], "--case zzzz"),
        (
            ["run", "--matrix", str(tmp / "absent.yaml"), "--kernel", "torch", "--db", url],
            "no such",
        ),
        ([*run, "--kernel", "torch", "--device", "quantum", "--db", url], "quantum"),
        (["report", "latest", "--db", url, "--out", "/proc/nope"], "--out"),
        (["report", "999", "--db", url, "--out", str(tmp / "r")], "999"),
        (["history", "--dtype", "fp32", "--db", f"sqlite:///{foreign}"], "not a convmatrix"),
        (["history", "--dtype", "fp32", "--db", missing], "does not exist"),
        (["diff", "1", "999", "--db", url], "999"),
        (
            [
                "run",
                "--matrix",
                "smoke",
                "--kernel",
                "torch",
                "-n",
                "0",
                "--db",
                url,
                "--report",
                str(tmp / "r"),
                "--no-db",
            ],
            "--no-db",
        ),
    ]


def test_every_malformed_command_line_is_one_line_exit_2_and_changes_nothing(
    tmp_path, convmatrix_db, capsys, monkeypatch
):
    monkeypatch.syspath_prepend(str(KERNELS))  # fault_kernels, importable in this process
    cases = _cli_cases(tmp_path, convmatrix_db)
    assert len(cases) >= 20
    watched = [convmatrix_db, tmp_path / "foreign.db", tmp_path / "garbage.db"]
    for argv, words in cases:
        before = [_db_state(p) for p in watched]
        line = _refused(argv, capsys)
        assert words in line, (argv, line)
        assert [_db_state(p) for p in watched] == before, argv
        assert not (tmp_path / "missing.db").exists(), argv
    with sqlite3.connect(tmp_path / "foreign.db") as conn:  # never switched to WAL
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


# -- fuzz ---------------------------------------------------------------------------------------
_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
_KEYS = st.sampled_from(
    ["name", "suites", "op", "dimensions", "width", "seqlen", "dim", "batch", "timeout_s",
     "tolerances", "policy", "geometry", "seed", "fwd", "update", "strategy", "x"]
)  # fmt: skip
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=30,
)


def _to_yaml(value: object) -> str:
    import json

    return json.dumps(value, allow_nan=True)  # JSON is YAML (NaN/Infinity are plain strings)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_TREES)
def test_fuzzed_documents_are_a_matrix_error_or_a_valid_spec(tree):
    try:
        root = load_yaml(_to_yaml(tree), "fuzz.yaml")
        spec = parse_matrix(root, name="fuzz", path="fuzz.yaml", content_hash="0")
        expand_matrix(spec)
    except MatrixError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200) | st.builds(lambda t: BASE + t, st.text(max_size=60)))
def test_fuzzed_text_is_a_matrix_error_or_a_valid_spec(text):
    try:
        root = load_yaml(text, "fuzz.yaml")
        spec = parse_matrix(root, name="fuzz", path="fuzz.yaml", content_hash="0")
        expand_matrix(spec)
    except MatrixError:
        pass


# -- round two (issue 23) -------------------------------------------------------------------------
def test_serve_answers_400_to_malformed_input_and_404_to_a_name_matching_nothing(convmatrix_db):
    """A 5000-digit run id was a 500 (int() of it, or a BIGINT overflow), ``since`` of a
    trillion days a 500 (timedelta overflow); malformed filters were 404s."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from convmatrix.service.app import create_app

    with TestClient(create_app(f"sqlite:///{convmatrix_db}")) as client:
        malformed = [
            "/runs/" + "9" * 5000,
            "/api/runs/" + "1" * 5000,
            "/diff/1/" + "2" * 5000,
            "/history/float32?since=999999999999d",
            "/api/history/float32?since=99999999999999999999999999d",
            "/history/float33",
            "/?kind=bogus",
            "/?colour=blue",
            "/?since=yesterday",
            "/regressions?state=lost",
            "/runs/a%00b",
            "/?kernel=" + "k" * 5000,
        ]
        for path in malformed:
            answer = client.get(path)
            assert answer.status_code == 400, (path[:80], answer.status_code, answer.text[:300])
            assert answer.text.count("\n") == 1 and len(answer.text) < 400, answer.text[:500]
        for path in ["/runs/99", "/runs/99999999999999999999", "/runs/no-such-label",
                     "/cases/ffffffffffff"]:  # fmt: skip
            assert client.get(path).status_code == 404, path
        assert client.get("/runs/1").status_code == 200
        assert client.get("/history/float32?since=30d").status_code == 200


def _export(db: Path, tmp: Path) -> list[dict]:
    """The lines ``convmatrix export --all`` writes of ``db``, parsed."""
    out = tmp / "valid.jsonl"
    assert main(["export", "--all", "--out", str(out), "--db", f"sqlite:///{db}"]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _lines_with(lines: list[dict], kind: str, change) -> str:
    """The export with ``change`` applied (in place) to the first line of ``kind``."""
    lines = copy.deepcopy(lines)
    change(next(line for line in lines if line["kind"] == kind))
    return "".join(json.dumps(line) + "\n" for line in lines)


def _set(path: str, value):
    """A change that sets the dotted ``path`` (``result.case.seqlen``) of a line."""

    def change(line: dict) -> None:
        *parents, last = path.split(".")
        target = line
        for key in parents:
            target = target[key][0] if isinstance(target[key], list) else target[key]
        target[last] = value

    return change


def _import_corpus(lines: list[dict]) -> dict[str, str | bytes]:
    valid = "".join(json.dumps(line) + "\n" for line in lines)
    regression = {
        "kind": "regression", "alert": None, "first_bad_run": lines[0]["uid"],
        "last_good_run": None, "fixed_run": None, "created_at": None, "updated_at": None,
        "events": [], "kernel": "torch", "matrix": "base", "device": "cpu",
        "case_id": "0" * 12, "case_name": "x", "output": "y",
        "regression_kind": "new_failure", "state": "exploded", "detail": "",
    }  # fmt: skip
    return {
        "outcome_unknown": _lines_with(lines, "result", _set("result.outcome", "exploded")),
        "seqlen_sql": _lines_with(
            lines, "result", _set("result.case.seqlen", "4; DROP TABLE runs")
        ),
        "dim_huge": _lines_with(lines, "result", _set("result.case.dim", 10**30)),
        "duration_text": _lines_with(lines, "result", _set("result.duration_s", "fast")),
        "peak_huge": _lines_with(lines, "result", _set("result.peak_mem_mb", 10**400)),
        "message_object": _lines_with(lines, "result", _set("result.message", {"a": 1})),
        "metric_text": _lines_with(lines, "result", _set("result.outputs.e_abs", "small")),
        "property_nul": _lines_with(lines, "result", _set("result.properties.name", "a\x00b")),
        "run_far_future": _lines_with(lines, "run", _set("started_at", "9999-12-31T00:00:00")),
        "run_date_text": _lines_with(lines, "run", _set("started_at", "yesterday")),
        "run_status": _lines_with(lines, "run", _set("status", "exploded")),
        "run_kind": _lines_with(lines, "run", _set("meta.kind", "nightly")),
        "kernel_number": _lines_with(lines, "run", _set("meta.kernel", 5)),
        "kernel_long": _lines_with(lines, "run", _set("meta.kernel", "k" * 300)),
        "label_nul": _lines_with(lines, "run", _set("meta.label", "a\x00b")),
        "planned_text": _lines_with(lines, "run", _set("meta.n_planned", "12")),
        "versions_nan": _lines_with(lines, "run", _set("meta.versions", {"torch": float("nan")})),
        "uid_path": _lines_with(lines, "run", _set("uid", "../../etc")),
        "unknown_field": _lines_with(lines, "run", _set("meta.colour", "blue")),
        "truncated": valid[: len(valid) - 40],
        "valid_then_bad": valid + valid.splitlines()[0].replace('"run"', '"nur"') + "\n",
        "result_first": "".join(valid.splitlines(keepends=True)[1:]),
        "regression_state": valid + json.dumps(regression) + "\n",
        "deep": valid + '{"kind": "result", "run": 1, "result": ' + "[" * 100_000 + "\n",
        "binary": b"\x00\xff\xfe" * 300,
        "latin1": valid.encode() + "# caf\xe9\n".encode("latin-1"),
        "gzip_garbage": gzip.compress(b"not json at all\n"),
        "gzip_truncated": gzip.compress(valid.encode())[:60],
    }


def test_every_malformed_import_is_one_line_exit_2_and_the_database_unchanged(
    tmp_path, convmatrix_db, capsys
):
    """Wrong types, unknown outcomes, huge numbers, text in integer columns, a run dated
    9999-12-31, a file cut short or bad at its end, binary or gzip input: each was a traceback
    or a half-imported run (or, for the date, 'latest' for ever)."""
    lines = _export(convmatrix_db, tmp_path)
    capsys.readouterr()  # export's own line
    assert [line["kind"] for line in lines][:2] == ["run", "result"]
    corpus = _import_corpus(lines)
    files = tmp_path / "corpus"  # not beside the database: _db_state watches its directory
    files.mkdir()
    before = _db_state(convmatrix_db)
    for name, text in corpus.items():
        path = files / f"{name}.jsonl"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        line = _refused(["import", str(path), "--db", f"sqlite:///{convmatrix_db}"], capsys)
        assert str(path) in line, (name, line)
        assert _db_state(convmatrix_db) == before, name
    fresh = tmp_path / "fresh.db"
    _refused(["import", str(files / "seqlen_sql.jsonl"), "--db", f"sqlite:///{fresh}"], capsys)
    assert not fresh.exists(), "a refused import created its database"


def test_a_gzip_export_imports_and_a_good_file_after_a_bad_one_changes_nothing(
    tmp_path, convmatrix_db, capsys
):
    lines = _export(convmatrix_db, tmp_path)
    capsys.readouterr()
    valid = "".join(json.dumps(line) + "\n" for line in lines)
    packed = tmp_path / "export.jsonl.gz"
    packed.write_bytes(gzip.compress(valid.encode()))
    target = tmp_path / "target.db"
    url = f"sqlite:///{target}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_lines_with(lines, "result", _set("result.outcome", "exploded")))
    _refused(["import", str(packed), str(bad), "--db", url], capsys)  # all files checked first
    assert not target.exists()
    assert main(["import", str(packed), "--db", url, "--no-scan"]) == 0
    assert "import: runs 1" in capsys.readouterr().out
    assert main(["import", str(packed), "--db", url, "--no-scan"]) == 0  # twice: nothing new
    assert "import: runs none" in capsys.readouterr().out


# -- limits checked before work -----------------------------------------------------------------
def _million(tmp: Path, extra: str = "") -> Path:
    """A full matrix of 100 x 100 x 100 = 10^6 cases (a million combinations to expand)."""
    values = ", ".join(str(v) for v in range(1, 101))
    text = (
        _swap("seqlen: [5]", f"seqlen: [{values}]")
        .replace("dim: [4]", f"dim: [{values}]")
        .replace("batch: [1]", f"batch: [{values}]")
        + extra
    )
    path = tmp / "million.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["run", "expand"])
def test_a_full_matrix_of_a_million_cases_is_refused_in_seconds_with_its_count(
    tmp_path, capsys, command
):
    """A full matrix of 1.7 million cases took 116 s and 1 GB to expand before anything ran;
    the count is now taken from the suites' sizes, before expanding."""
    path = _million(tmp_path)
    db = tmp_path / "results.db"
    argv = ["run", "--matrix", str(path), "--kernel", "torch", "-n", "0", "--db", f"sqlite:///{db}"]
    argv = argv if command == "run" else ["expand", str(path)]
    start = time.perf_counter()
    line = _refused(argv, capsys)
    assert time.perf_counter() - start < 5.0
    assert "1,000,000 cases" in line and "100,000" in line and "--max-cases" in line, line
    assert not db.exists()


def test_the_case_limit_is_raised_by_the_matrix_or_max_cases_and_checked(tmp_path, capsys):
    path = _million(tmp_path, "max_cases: 10\n")  # the matrix's own limit, lowered
    line = _refused(["expand", str(path), "--max-cases", "999999"], capsys)
    assert "1,000,000 cases" in line and "999,999" in line, line
    small = tmp_path / "small.yaml"
    small.write_text(BASE + "max_cases: 1\n")
    assert main(["expand", str(small)]) == 0  # 1 case: within its own limit
    capsys.readouterr()
    _refused(["expand", str(small), "--max-cases", "0"], capsys)
    two = tmp_path / "two.yaml"
    two.write_text(_swap("seqlen: [5]", "seqlen: [5, 6]") + "max_cases: 1\n")
    assert "2 cases" in _refused(["expand", str(two)], capsys)
    assert main(["expand", str(two), "--max-cases", "2"]) == 0  # the flag raises it
    capsys.readouterr()
    argv = ["run", "--matrix", str(two), "--kernel", "torch", "-n", "0", "--no-db"]
    assert "over the limit of 1" in _refused(argv, capsys)
    assert main([*argv, "--max-cases", "2"]) == 0


# environment variable -> a value its reader refuses, and words of the one line
BAD_ENVIRONMENT = {
    "CONVMATRIX_CPU_CLOCK": ("wal", "choose one of process, wall"),
    "CONVMATRIX_TILED_GEOMETRY": ("T=1000000000", "at most 65536"),
    "CONVMATRIX_DB": ("results.db", "not a database URL"),
    "CONVMATRIX_BASE_URL": ("serve.example", "http(s) URL"),
    "CONVMATRIX_PROGRESS_S": ("often", "number of seconds"),
    "CONVMATRIX_DB_RETRY_S": ("-5", "from 0 to"),
    "TRITON_INTERPRET": ("maybe", "choose one of"),
    "CONVMATRIX_THREADS": ("many", "auto, torch or a number of threads"),
    "OMP_NUM_THREADS": ("100000", "100000 threads a process is past this machine's cap"),
    "OMP_THREAD_LIMIT": ("lots", "a whole number of threads >= 1"),
    "MKL_NUM_THREADS": ("4,2", "a whole number of threads >= 1"),
    "OPENBLAS_NUM_THREADS": ("0", "a whole number of threads >= 1"),
    "NUMEXPR_NUM_THREADS": ("99999", "past this machine's cap"),
    "VECLIB_MAXIMUM_THREADS": ("-1", "a whole number of threads >= 1"),
}


@pytest.mark.parametrize("variable", sorted(BAD_ENVIRONMENT))
def test_every_environment_variable_is_checked_at_start_up(tmp_path, capsys, monkeypatch, variable):
    """A typo in CONVMATRIX_CPU_CLOCK was found only inside timing (seven regressions
    recorded); a geometry of a billion-wide tile became a 25 TB allocation blamed on the
    kernel. Now every command refuses a bad declared variable before any work."""
    value, words = BAD_ENVIRONMENT[variable]
    monkeypatch.setenv(variable, value)
    db = tmp_path / "results.db"
    matrix = tmp_path / "one.yaml"
    matrix.write_text(BASE)
    for argv in (
        ["run", "--matrix", str(matrix), "--kernel", "torch", "-n", "0", "--db", f"sqlite:///{db}"],
        ["expand", str(matrix)],
    ):
        line = _refused(argv, capsys)
        assert f"environment variable {variable}" in line and words in line, line
    assert not db.exists()


def test_the_environment_check_never_shows_a_password(capsys, monkeypatch):
    monkeypatch.setenv("CONVMATRIX_DB", "no-scheme:u:s3cret@host/db")
    line = _refused(["expand", "smoke"], capsys)
    assert "CONVMATRIX_DB" in line and "s3cret" not in line, line
