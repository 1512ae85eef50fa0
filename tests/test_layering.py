"""The package's layering, read from its source: every import points down, no file cycles,
and the commands that never touch a tensor never import torch.

The layers are ``LAYERS`` below, bottom to top; docs/architecture.md's layer table is their one
description and a test holds it to this order. Every
import is walked, including imports inside functions and under ``TYPE_CHECKING``: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import convmatrix

PACKAGE = Path(convmatrix.__file__).parent
LAYERS = (
    "core", "compare", "matrix", "kernels", "runners", "search", "db", "reports", "service",
    "pipeline",
    "commands",
)  # fmt: skip
TOP = len(LAYERS) - 1  # the command layer: commands, cli, api, __main__ and the root


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(module: str, name: str | None) -> str:
    """The module ``from module import name`` depends on: the submodule when ``name`` is one."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def imports_of(module: str) -> set[str]:
    """Every convmatrix module ``module`` imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("convmatrix")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("convmatrix"):
            found |= {_target(node.module, a.name) for a in node.names}
    return found - {module}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else TOP


GRAPH = {module: imports_of(module) for module in MODULES}


def test_the_architecture_page_s_layer_table_is_this_order():
    """docs/architecture.md lists the layers once, top first; the other pages link to it."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page.split("## Layers", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    listed = [line.split("`convmatrix.", 1)[1].split("`", 1)[0] for line in rows]
    assert listed[::-1] == list(LAYERS), listed


def test_the_layers_cover_every_module():
    unplaced = [m for m in MODULES if layer(m) == TOP and m.split(".")[1:2] not in (
        ["commands"], ["cli"], ["api"], ["__main__"], [],
    )]  # fmt: skip
    assert not unplaced, f"modules outside every layer: {unplaced}"


def test_every_import_points_down():
    upward = [
        f"{source} ({LAYERS[layer(source)]}) imports {target} ({LAYERS[layer(target)]})"
        for source, targets in GRAPH.items()
        for target in targets
        if target in MODULES and layer(target) > layer(source)
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_two_files_import_each_other_even_indirectly():
    # A package's __init__ re-exporting its submodules is not a cycle with them: the edge
    # from a submodule to its own package's __init__ is the one Python itself follows.
    graph = defaultdict(set)
    for source, targets in GRAPH.items():
        for target in targets:
            if not source.startswith(target + "."):
                graph[source].add(target)
    assert _cycles(dict(graph)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


PROBE = """
import sys
from convmatrix.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(m for m in HEAVY if m in sys.modules)
print("IMPORTED:" + ",".join(heavy))
"""


def imported(argv: list[str], heavy: tuple[str, ...], cwd: Path | None = None) -> str:
    """Which of ``heavy`` the command ``convmatrix argv`` imported, comma-separated."""
    probe = f"HEAVY = {heavy!r}\n" + PROBE
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("IMPORTED:")), None)
    assert line is not None, done.stdout + done.stderr
    return line[len("IMPORTED:") :]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["history", "--help"],
        ["history", "--dtype", "bf16"],
        ["report", "--help"],
        ["diff", "--help"],
        ["expand", "smoke"],
    ],
    ids=" ".join,
)
def test_commands_that_touch_no_tensor_never_import_torch(argv, tmp_path):
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    env_argv = [*argv, "--db", db] if argv[0] == "history" and "--help" not in argv else argv
    if argv[0] == "history" and "--help" not in argv:
        subprocess.run(  # an empty database, so history reads a real (empty) schema
            [sys.executable, "-m", "convmatrix", "db", "upgrade", "--db", db],
            check=True,
            capture_output=True,
        )
    heavy = imported(env_argv, ("torch", "pytest", "alembic"))
    assert heavy == "", f"convmatrix {' '.join(argv)} imported {heavy}"


def test_every_command_s_parser_builds_without_torch():
    """``--help`` and the docs' CLI reference (docs_hooks/cli_reference.py, built in an
    environment without torch: ``nox -s docs``) build every parser; none may need torch."""
    probe = (
        "import sys\n"
        "from convmatrix.cli import COMMANDS, build_parser\n"
        "loaded = [c for c in COMMANDS if build_parser(c) and 'torch' in sys.modules]\n"
        "print('TORCH:' + ','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "TORCH:\n" in done.stdout, f"parsers that imported torch (first one): {done.stdout}"


def test_commands_that_only_read_never_import_the_orm(tmp_path):
    """``history``, ``report`` of a stored run, ``diff`` and the listing and showing of
    ``regressions`` read through Core: importing ``sqlalchemy.orm`` and mapping the classes
    was a third of their start-up (issue 34's 0.3 s of CPU, docs/benchmarks.md). Nor does a
    stored report, nor a diff printed to the terminal (no ``--out``), import Jinja2."""
    from reports_support import synthetic_results, write_run
    from runner_helpers import convmatrix_cmd, run

    from convmatrix.db import open_database

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    engine = open_database(db)
    write_run(engine, synthetic_results(20), commit="a" * 40)
    write_run(engine, synthetic_results(20, bug=lambda c: c.seqlen > 64), commit="b" * 40)
    engine.dispose()
    scanned = run(convmatrix_cmd("regressions", "scan", "2", "--db", db), tmp_path)
    assert scanned.returncode == 0 and "(alert 1)" in scanned.stdout, scanned  # the ORM may load
    out = ["--out", str(tmp_path / "out")]
    first = imported(["report", "2", "--db", db, *out], ("sqlalchemy.orm",))  # builds, stores
    assert first == ""
    reading = (
        ["report", "2", *out], ["history", "--dtype", "bf16"], ["diff", "1", "2"],
        ["regressions"], ["regressions", "show", "1"], ["regressions", "show", "r1"],
    )  # fmt: skip
    for argv in reading:
        heavy = imported([*argv, "--db", db], ("sqlalchemy.orm", "jinja2"), cwd=tmp_path)
        assert heavy == "", f"{' '.join(argv)}: {heavy}"
    listed = run(convmatrix_cmd("regressions", "--db", db), tmp_path).stdout
    assert listed.startswith("alert 1:") and "#1 detected" in listed, listed


def test_kernels_are_sorted_by_role_with_few_modules_at_the_top():
    # oracle, interface, builtin, adapters, doubles: a reader finds a kernel by what it is for.
    top = sorted(p.name for p in (PACKAGE / "kernels").iterdir() if p.suffix == ".py" or (
        p.is_dir() and (p / "__init__.py").exists()
    ))  # fmt: skip
    assert len(top) <= 10, top
    assert {"oracle", "interface", "builtin", "adapters", "doubles"} <= set(top)


def test_no_command_module_imports_another():
    # A command parses and prints; what two commands share lives below them (the pipeline,
    # the service) or in the one module of shared arguments.
    commands = {m for m in MODULES if m.startswith("convmatrix.commands.")}
    shared = {"convmatrix.commands.arguments"}
    crossing = sorted(
        f"{m} imports {t}" for m in commands for t in GRAPH[m] if t in commands - shared - {m}
    )
    assert not crossing, crossing


def test_the_run_command_only_parses_and_prints():
    # Scan, confirm, shrink, report, JUnit and the job summary are steps of
    # convmatrix.pipeline.run;
    # printing kernel text to a terminal goes through core.sanitise.terminal_safe.
    imported = GRAPH["convmatrix.commands.run"]
    assert imported <= {
        "convmatrix.runners.options", "convmatrix.pipeline.run", "convmatrix.core.sanitise",
    }, imported  # fmt: skip
    assert [name for name, _ in importlib.import_module("convmatrix.pipeline.run").STEPS] == [
        "prepare", "execute", "scan", "confirm", "shrink", "report", "ci outputs",
    ]  # fmt: skip
