"""``load_matrix(name_or_path)``: a built-in matrix by name, or a YAML file by path."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from convmatrix.matrix.errors import Mark, MatrixError, did_you_mean
from convmatrix.matrix.schema import parse_matrix
from convmatrix.matrix.source import load_yaml
from convmatrix.matrix.spec import MatrixSpec

__all__ = ["MAX_MATRIX_BYTES", "builtin_names", "builtin_path", "load_matrix"]

MAX_MATRIX_BYTES = 1 << 20  # a matrix is a page of YAML; 1 MiB is far past any real one


def _builtin_dir() -> Path:
    return Path(str(resources.files("convmatrix.matrix") / "builtin"))


def builtin_names() -> list[str]:
    """Names of the matrices shipped in the package (``smoke``, ``nightly``, ...)."""
    return sorted(p.stem for p in _builtin_dir().glob("*.yaml"))


def builtin_path(name: str) -> Path:
    return _builtin_dir() / f"{name}.yaml"


def load_matrix(name_or_path: str) -> MatrixSpec:
    """Load and validate a matrix. A built-in name wins over a same-named file without a
    directory part; write ``./nightly`` for such a file. Raises MatrixError (exit 2)."""
    names = builtin_names()
    path = builtin_path(name_or_path) if name_or_path in names else Path(name_or_path)
    if not path.is_file():
        hint = did_you_mean(name_or_path, names)
        raise MatrixError(
            None,
            name_or_path,
            f"no such matrix file or built-in matrix{hint} (built-in: {', '.join(names)})",
        )
    size = path.stat().st_size
    if size > MAX_MATRIX_BYTES:
        raise MatrixError(
            Mark(str(path), 1, 1),
            "(document)",
            f"{size} bytes: a matrix file may have at most {MAX_MATRIX_BYTES} (1 MiB)",
        )
    data = path.read_bytes()[: MAX_MATRIX_BYTES + 1]  # the file may grow after the stat
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MatrixError(Mark(str(path), 1, 1), "(document)", f"not UTF-8 text: {exc}") from None
    if "\x00" in text:
        before = text[: text.index("\x00")]
        line, col = before.count("\n") + 1, len(before) - before.rfind("\n")
        raise MatrixError(Mark(str(path), line, col), "(document)", "a NUL character in the text")
    root = load_yaml(text, str(path))
    return parse_matrix(
        root, name=path.stem, path=str(path), content_hash=hashlib.sha256(data).hexdigest()
    )
