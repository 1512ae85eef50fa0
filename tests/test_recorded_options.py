"""A run's options have one recorded form (``RunOptions.recorded``, read by ``core.recorded``)
and one command line (``RunOptions.to_argv``): every field survives both, a row written by an
older release still reads, and the reruns of a recorded run (confirm, bisect, the report's
command) keep how it judged its cases: a run under ``--policy threshold`` is rerun under it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest
from runner_helpers import TINY, TINY_L7
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.core.recorded import Recorded
from convmatrix.db import open_database
from convmatrix.db.database import Database
from convmatrix.db.queries import resolve_run
from convmatrix.pipeline.confirm import _rerun_options
from convmatrix.reports.run_view import rerun_command
from convmatrix.reports.viewmodel import run_header
from convmatrix.runners.options import RunOptions, add_cli_options
from convmatrix.service.bisect import Asked, plan_bisection, step_script

FIELDS = dataclasses.fields(RunOptions)
HINTS = typing.get_type_hints(RunOptions)


def _default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _value_of(kind: object, name: str) -> object:
    """A value of type ``kind`` (a non-None one), or fail: a field no test can set."""
    if kind is bool:
        return True
    if kind is int:
        return 7
    if kind is float:
        return 0.5
    if kind is str:
        return f"given-{name}"
    if kind is Path:
        return Path(f"out/{name}")
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        return origin([f"{name}-a", f"{name}-b"])
    if dataclasses.is_dataclass(kind):
        return kind(**{f.name: _value_of(HINTS_OF(kind)[f.name], f.name) for f in
                       dataclasses.fields(kind)})  # fmt: skip
    pytest.fail(f"RunOptions.{name}: no test value for a {kind!r}; teach _value_of")


def HINTS_OF(kind: type) -> dict[str, object]:
    return typing.get_type_hints(kind)


def non_default(f: dataclasses.Field) -> object:
    """A value other than the field's default, from its flag's metadata, else its type."""
    flag = f.metadata.get("flag")
    default = _default(f)
    if flag is not None and flag.choices:
        value = next(c for c in flag.choices if c != default)
        return [value] if isinstance(default, list) else value
    if flag is not None and flag.action == "count":
        return 2
    if flag is not None and isinstance(flag.type, type):
        kind = flag.type
    else:
        hint = HINTS[f.name]
        kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kind = next(k for k in kinds if k is not type(None))
    if kind is bool:
        return not default
    value = _value_of(kind, f.name)
    assert value != default, f.name
    return value


def parse(argv: list[str]) -> RunOptions:
    parser = argparse.ArgumentParser()
    add_cli_options(parser)
    return RunOptions.from_namespace(parser.parse_args(argv))


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_field_survives_its_recorded_form(f):
    options = RunOptions(**{f.name: non_default(f)})
    recorded = options.recorded()
    assert json.loads(json.dumps(recorded)) == recorded  # JSON-safe, as the row keeps it
    assert set(recorded) == {g.name for g in FIELDS}
    assert RunOptions.from_recorded(recorded) == options


@pytest.mark.parametrize("f", [f for f in FIELDS if "flag" in f.metadata], ids=lambda f: f.name)
def test_every_flagged_field_survives_its_command_line(f):
    options = RunOptions(**{f.name: non_default(f)})
    argv = options.to_argv()
    assert argv and argv[0] in f.metadata["flag"].flags  # only the value not the default
    assert parse(argv) == options


def test_all_fields_at_once_and_none_given():
    everything = RunOptions(**{f.name: non_default(f) for f in FIELDS})
    assert RunOptions.from_recorded(everything.recorded()) == everything
    code = {f.name: getattr(everything, f.name) for f in FIELDS if "flag" not in f.metadata}
    assert RunOptions.from_namespace(_namespace(everything.to_argv()), **code) == everything
    assert RunOptions().to_argv() == [] and parse([]) == RunOptions()


def _namespace(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_options(parser)
    return parser.parse_args(argv)


def test_a_value_that_looks_like_a_flag_is_kept_a_value():
    options = RunOptions(label="-x", cases=["-y"])
    assert parse(options.to_argv()) == options


def test_the_recorded_database_url_holds_no_password():
    recorded = RunOptions(db="postgresql+psycopg://ci:s3cret@db:5432/cm").recorded()
    assert recorded["db"] == "postgresql+psycopg://ci:***@db:5432/cm"


def test_a_row_recorded_by_an_older_release_still_reads():
    old = {  # RunMeta.options as releases before the recorded form wrote it
        "kernel_spec": "pkg.mod:Kernel", "matrix_sources": ["/m/tiny.matrix.yaml"],
        "workers": 2, "executor": "xdist", "device": "cuda", "case_timeout_s": 30.0,
        "cases": ["abc123"], "policy": "threshold", "reference_device": "host",
        "reference_cache": True, "arithmetic": {"accumulate": "float32"},
        "threads": {"spec": "auto"}, "kernel": {"layout": "cl"},
    }  # fmt: skip
    options = RunOptions.from_recorded(old)
    assert (options.kernel, options.rule, options.case_timeout) == (
        "pkg.mod:Kernel",
        "threshold",
        30.0,
    )
    assert (options.device, options.reference_device, options.workers) == ("cuda", "host", 2)
    assert options.cases == ["abc123"] and options.matrix is None
    row = Recorded.of(old)
    assert row.matrix("tiny") == "/m/tiny.matrix.yaml" and row.kernel("k") == "pkg.mod:Kernel"
    assert row.arithmetic == {"accumulate": "float32"} and row.described == {"layout": "cl"}
    assert row.threads == {"spec": "auto"} and row.case_timeout == 30.0
    rerun = RunOptions.rerun(old, "tiny", "k", cases=["abc123"])
    assert (rerun.matrix, rerun.kernel, rerun.rule) == (
        "/m/tiny.matrix.yaml",
        "pkg.mod:Kernel",
        "threshold",
    )
    assert Recorded.of({}).kernel("torch") == "torch" and Recorded.of(None).matrix("m") == "m"


def test_a_run_under_threshold_is_confirmed_bisected_and_rerun_under_threshold(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    argv = ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0", "--case", TINY_L7,
            "--db", url, "--policy", "threshold", "--reference-device", "host",
            "--reference-cache", "off"]  # fmt: skip
    assert main(argv) == 0
    engine = open_database(url)
    with Session(engine) as session:
        info = resolve_run(session, "latest")
        header = run_header(info, url)
    engine.dispose()
    recorded = Recorded.of(info.options)
    assert recorded.given["rule"] == "threshold" and recorded.matrix("") == str(TINY)
    database = Database(url)
    confirm = _rerun_options(info, database, 0, [TINY_L7])
    assert (confirm.rule, confirm.reference_device, confirm.kind) == (
        "threshold",
        "host",
        "confirm",
    )
    assert (confirm.matrix, confirm.kernel, confirm.cases) == (str(TINY), "torch", [TINY_L7])
    request, _ = plan_bisection(
        database,
        Asked(repo=tmp_path, good="a" * 40, bad="b" * 40, case_id=TINY_L7, run=str(info.id)),
    )
    step = step_script(request)
    assert "--policy threshold" in step and "--reference-device host" in step, step
    assert f"--matrix {TINY}" in step and "--kind bisect" in step and "-n 0" in step
    command = rerun_command(header, [TINY_L7])
    assert "--policy threshold" in command and "--reference-device host" in command, command
    assert command.startswith(f"convmatrix run --matrix {TINY} --kernel torch --device cpu")
    assert parse(command.split()[2:]).rule == "threshold"
