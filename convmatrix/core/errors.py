"""Errors that end a command cleanly with an exit code instead of a traceback."""

from __future__ import annotations

__all__ = ["EXIT_CODES", "ConvmatrixError", "InfrastructureError", "InputError", "UsageError"]


class ConvmatrixError(Exception):
    """Base of errors the CLI reports as one message; ``exit_code`` is the process status."""

    exit_code = 1


class UsageError(ConvmatrixError):
    """Bad arguments, a malformed matrix, an unknown kernel: exit status 2 (docs/spec.md §6)."""

    exit_code = 2


class InputError(UsageError):
    """Input that no query can hold (a 5000-digit run id, a date past the year 9999): a usage
    error, which ``convmatrix serve`` answers with 400 where a name matching nothing is 404."""


class InfrastructureError(ConvmatrixError):
    """The database or the executor failed under a run that was otherwise fine (a server
    gone, a full disk, a lost cluster): exit status 3, so CI can tell it from failing cases
    (1) and from a wrong command line (2)."""

    exit_code = 3


# Every exit status of the command line, documented once (README, docs/spec.md §6, the CLI).
EXIT_CODES = {
    0: "every case passed (skips allowed)",
    1: "a case failed, crashed, timed out or errored, or the run stopped early",
    2: "usage, matrix or configuration error (nothing ran)",
    3: "infrastructure failure: the database or the executor (results kept in a journal)",
    130: "interrupted (SIGINT or SIGTERM)",
}
