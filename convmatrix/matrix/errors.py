"""Errors in a matrix file: one line naming file, line, column and key path.

A user who mistypes ``seqlne`` or writes ``tile+1`` for a kernel without a time tile gets
``nightly.yaml:12:7: suites.fwd.dimensions.seqlne: unknown key (did you mean 'seqlen'?)``
and exit status 2, never a traceback (docs/spec.md §7).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from convmatrix.core.errors import UsageError

__all__ = ["Mark", "MatrixError", "did_you_mean"]


@dataclass(frozen=True)
class Mark:
    """Where a YAML node starts: file name and 1-based line and column."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class MatrixError(UsageError):
    """A malformed matrix. ``str()`` is ``"<file>:<line>:<col>: <key.path>: <message>"``."""

    def __init__(self, mark: Mark | None, path: str, message: str) -> None:
        self.mark = mark
        self.path = path or "(document)"
        self.message = message
        super().__init__(str(self))

    @property
    def file(self) -> str | None:
        return self.mark.file if self.mark else None

    @property
    def line(self) -> int | None:
        return self.mark.line if self.mark else None

    @property
    def col(self) -> int | None:
        return self.mark.col if self.mark else None

    def __str__(self) -> str:
        if self.mark is None:
            return f"{self.path}: {self.message}"
        return f"{self.mark}: {self.path}: {self.message}"


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    names = sorted(set(candidates))
    by_lower = {name.lower(): name for name in names}
    close = difflib.get_close_matches(str(word).lower(), sorted(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
