"""The glossary (docs/architecture.md, "Glossary") held to the source: one word, one meaning.

Read from the source like tests/test_layering.py (whose ``MODULES`` it walks):

- no two classes of the package share a name (a traceback, a search or an import picks one
  of two by accident);
- a ``RunAccount`` bound to a name is called ``account`` (it was ``summary`` in five modules
  and a hook, beside the CI job summary);
- one ``Policy`` (``core.tolerances.Policy``): no other class is named ``...Policy``;
- ``REJECTED``: words that meant something else here, per package, in prose (docstrings,
  comments, strings) or identifiers, each with the word that replaced it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict

import pytest
from test_layering import MODULES

# (packages it applies to, or () for all; pattern; what to write instead), in prose and
# identifiers; PROSE_ONLY: in prose only (an identifier ``engine`` is a SQLAlchemy engine).
REJECTED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    ((), r"\bretry bound\b", "retry limit (a bound is the error bound of docs/spec.md §4)"),
    ((), r"\bbound to\b", "pinned to (a device), listening on (a server)"),
    ((), r"\bBoundedOutput\b", "CappedOutput"),
    (
        (),
        r"\bnoise floor\b|\bdefault_floor\b|\bw_floor\b",
        "noise level, w_tiny: floors are the time floor and the usage floor",
    ),
    ((), r"\bThreadPolicy\b", "ThreadSetting (a policy judges outputs)"),
)
PROSE_ONLY: tuple[tuple[tuple[str, ...], str, str], ...] = (
    # Outside db/, "engine" in prose is the database engine's word only when it says so.
    (
        (
            "core",
            "compare",
            "matrix",
            "kernels",
            "runners",
            "search",
            "reports",
            "service",
            "pipeline",
            "commands",
        ),
        r"(?i)(?<!database )(?<!sqlalchemy )\bengines?\b",
        "executor (xdist, ray)",
    ),
)
# Text a pattern may match without meaning the rejected word: module paths, flags, types.
_QUOTED = re.compile(
    r"db\.engine|--engine|\w+\.engines\b|\bEngine\b|_engine\b|engine\.\w+|\bengine[,:)]"
)
_EXEMPT = {"convmatrix.core.moved"}  # it names the old paths it maps


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and string literal."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            for i, line in enumerate(tok.string.splitlines()):
                found.append((tok.start[0] + i, line))
    return found


def _identifiers(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        name = (
            getattr(node, "name", None) or getattr(node, "id", None) or getattr(node, "arg", None)
        )
        if isinstance(node, ast.Attribute):
            name = node.attr
        if isinstance(name, str):
            found.append((getattr(node, "lineno", 0), name))
    return found


def rejected_words(module: str, source: str) -> list[str]:
    """Every rejected word in ``module``'s source, as ``module:line: word -> instead``."""
    package = _package(module)
    prose = _prose(source)
    both = prose + _identifiers(ast.parse(source))
    hits = []
    rules = [(rule, both) for rule in REJECTED] + [(rule, prose) for rule in PROSE_ONLY]
    for (packages, pattern, instead), texts in rules:
        if packages and package not in packages:
            continue
        for line, text in texts:
            for match in re.finditer(pattern, _QUOTED.sub("", text)):
                hits.append(f"{module}:{line}: {match.group(0)!r} -> {instead}")
    return hits


def test_no_word_the_glossary_rejects():
    hits = [
        hit
        for module, path in MODULES.items()
        if module not in _EXEMPT
        for hit in rejected_words(module, path.read_text(encoding="utf-8"))
    ]
    assert hits == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("convmatrix.runners.x", '"""the xdist engine runs them"""', 1),
        ("convmatrix.pipeline.x", '"""over one database engine"""', 0),
        ("convmatrix.pipeline.x", "from convmatrix.db.engine import Reader", 0),
        ("convmatrix.db.x", '"""the engine"""', 0),  # db/ is where the engine lives
        ("convmatrix.service.x", "engine = database.engine", 0),  # an identifier
        ("convmatrix.runners.x", "# past the retry bound", 1),
        ("convmatrix.runners.x", "class BoundedOutput: ...", 1),
        ("convmatrix.kernels.x", "w_floor = 1.0", 1),
    ],
)
def test_the_check_itself(module, source, expected):
    assert len(rejected_words(module, source)) == expected


def _classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(module)
    return found


def test_no_two_classes_share_a_name():
    shared = {name: where for name, where in _classes().items() if len(where) > 1}
    assert shared == {}


def test_one_policy():
    policies = {name: where for name, where in _classes().items() if name.endswith("Policy")}
    assert policies == {"Policy": ["convmatrix.core.tolerances"]}


def _annotated_names(tree: ast.AST, type_name: str) -> list[tuple[int, str]]:
    """Names (arguments, assignments, attributes) annotated with ``type_name``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            target, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign):
            t = node.target
            target = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")
            annotation = node.annotation
        else:
            continue
        if re.search(rf"\b{type_name}\b", ast.unparse(annotation)):
            found.append((node.lineno, target))
    return found


def test_a_run_account_is_called_account():
    wrong = [
        f"{module}:{line}: {name}"
        for module, path in MODULES.items()
        for line, name in _annotated_names(
            ast.parse(path.read_text(encoding="utf-8")), "RunAccount"
        )
        if not (name == "account" or name.endswith("_account"))
    ]
    assert wrong == []
