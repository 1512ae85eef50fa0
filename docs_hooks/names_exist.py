"""MkDocs hook and test helper: every code name and repository path the docs cite exists.

Docs drift silently: a module moves, a class is renamed, and the page that taught it keeps
naming the old one. This check reads the prose people follow (``docs/*.md``, ``README.md``
and every docstring of the package, the tests and the benchmarks) and resolves, without
importing anything (the docs build has no torch):

- dotted names: ``convmatrix.<module>.<name>`` anywhere, and inside backticks names
  relative to the package whose first part is one of its subpackages
  (``runners.case.invoke.kernel_outputs``, ``db.database.Database``): the longest prefix that is
  a module, then a top-level name of that module (defined, imported, or a key of a lazy
  table: ``core.lazy``), then an attribute of that class;
- repository paths: ``convmatrix/...``, ``tests/...``, ``benchmarks/...``, ``docs/...``,
  ``examples/...`` anywhere, and inside backticks package-relative ones
  (``runners/case/invoke.py``); globs and placeholders (``*``, ``<``) are left alone.

A module path an earlier release published and that still imports through
``convmatrix.core.moved`` is still a stale name here: the docs teach today's paths.
``nox -s docs`` fails on any (``on_pre_build``); ``tests/test_docs_names.py`` runs the same.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "convmatrix"
SUBPACKAGES = (
    "core", "compare", "matrix", "kernels", "runners", "search", "db", "reports", "service",
    "pipeline", "commands",
)  # fmt: skip
TOP_DIRS = ("convmatrix", "tests", "benchmarks", "docs", "examples", "docs_hooks")
# Generated at build time (docs_hooks/): their text comes from the parsers and the README.
GENERATED = ("docs/cli.md", "docs/getting-started.md")

_DOTTED = re.compile(r"(?<![\w/.@-])convmatrix(?:\.[A-Za-z_]\w*)+")
_RELATIVE = re.compile(rf"^(?:{'|'.join(SUBPACKAGES)})(?:\.[A-Za-z_]\w*)+$")
_PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(TOP_DIRS)})/[\w./*<>{{}}-]*[\w*>}}]")
_REL_PATH = re.compile(rf"^(?:{'|'.join(SUBPACKAGES)})/[\w/-]*\.py$")
# Paths that are not this repository's (an upstream project's file) or are placeholders.
ALLOWED = {
    "tests/kernels/mamba/test_causal_conv1d.py": "vLLM's test file, in vLLM's repository",
    "docs/x.md": "a placeholder in docs_hooks/readme_excerpt.py's rule",
}
_TICKS = re.compile(r"``?([^`\n]+?)``?")


@dataclass(frozen=True)
class Stale:
    where: str  # file:line
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.name}: {self.why}"


def texts(root: Path = ROOT) -> Iterator[tuple[str, int, str]]:
    """(file, first line, text) of every page and docstring the check reads."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for page in pages:
        rel = page.relative_to(root).as_posix()
        if rel not in GENERATED:
            yield rel, 1, page.read_text(encoding="utf-8")
    for folder in ("convmatrix", "tests", "benchmarks", "examples", "docs_hooks"):
        for source in sorted((root / folder).rglob("*.py")):
            yield from _docstrings(source, source.relative_to(root).as_posix())


def _docstrings(path: Path, rel: str) -> Iterator[tuple[str, int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value.value
                if isinstance(value, str):
                    yield rel, body[0].lineno, value


def _old_paths() -> dict[str, str]:
    """Module paths of earlier releases (``convmatrix.core.moved``, stdlib only: no torch)."""
    from convmatrix.core.moved import MOVED

    return MOVED


# Where an old path is the subject (the table of moves and what documents or tests it).
OLD_PATHS_ALLOWED_IN = ("convmatrix/core/moved.py", "docs/contract.md", "tests/test_moved.py")


def check(root: Path = ROOT) -> list[Stale]:
    """Every stale name or path in the docs and docstrings under ``root``."""
    stale: list[Stale] = []
    old = _old_paths()
    for rel, first, text in texts(root):
        fenced = False
        for offset, line in enumerate(text.splitlines()):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            where = f"{rel}:{first + offset}"
            for name, why in _line_problems(line, root, fenced):
                if name in old and rel in OLD_PATHS_ALLOWED_IN:
                    continue
                if name in old:
                    why = f"moved to {old[name]}"
                stale.append(Stale(where, name, why))
    return stale


def _line_problems(line: str, root: Path, fenced: bool) -> Iterator[tuple[str, str]]:
    names = {m.group(0) for m in _DOTTED.finditer(line)}
    paths = {m.group(0).rstrip(".") for m in _PATH.finditer(line)}
    if not fenced:
        for quoted in _TICKS.findall(line):
            token = quoted.strip().split("(")[0].split(" ")[0].rstrip(".,:;")
            if _RELATIVE.match(token):
                names.add(f"{PACKAGE}.{token}")
            elif _REL_PATH.match(token):
                paths.add(f"{PACKAGE}/{token}")
    for name in sorted(names):
        why = _resolve(name, root)
        if why:
            yield name, why
    for path in sorted(paths - set(ALLOWED)):
        if not any(c in path for c in "*<{") and not (root / path).exists():
            yield path, "no such file or folder"


def _resolve(dotted: str, root: Path) -> str | None:
    """None when ``dotted`` names a module, or a name in one (and an attribute of a class
    there); else why not."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(root, parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        found = _defined(module).get(rest[0])
        if found is None:
            return f"{'.'.join(parts[:cut])} defines no {rest[0]!r}"
        if len(rest) > 1 and isinstance(found, ast.ClassDef) and rest[1] not in _members(found):
            return f"class {rest[0]} has no {rest[1]!r}"
        return None
    return "no such module"


def _module_file(root: Path, parts: list[str]) -> Path | None:
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _defined(module: Path) -> dict[str, Any]:
    """The names a module's top level binds (a class maps to its node), its ``_LAZY`` keys
    and its submodules."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0]: a for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)}
            if isinstance(node.value, ast.Dict):  # a lazy table (``core.lazy``): its keys
                names |= dict.fromkeys(_dict_keys(node.value), node)
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    names |= {(a.asname or a.name).split(".")[0]: a for a in inner.names}
    if module.name == "__init__.py":
        for child in module.parent.iterdir():
            if child.suffix == ".py" or (child / "__init__.py").is_file():
                names.setdefault(child.stem, child)
    return names


def _dict_keys(table: ast.Dict) -> list[str]:
    """The string keys of a dict literal, ``**dict.fromkeys(("a", "b"), ...)`` spreads too."""
    keys = [k.value for k in table.keys if isinstance(k, ast.Constant)]
    for key, value in zip(table.keys, table.values, strict=True):
        if key is None and isinstance(value, ast.Call) and value.args:
            first = value.args[0]
            if isinstance(first, ast.Tuple | ast.List):
                keys += [e.value for e in first.elts if isinstance(e, ast.Constant)]
    return [k for k in keys if isinstance(k, str)]


def _members(cls: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    if cls.bases:  # inherited members cannot be checked without importing: accept them
        found.add("*")
    return found


def on_pre_build(config: Any, **kwargs: Any) -> None:
    stale = check()
    if stale:
        from mkdocs.exceptions import PluginError

        listed = "\n".join(f"  {s}" for s in stale[:50])
        raise PluginError(f"{len(stale)} stale names or paths in the docs:\n{listed}")
