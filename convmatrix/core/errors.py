"""Errors that end a command cleanly with an exit code instead of a traceback."""

from __future__ import annotations

__all__ = ["ConvmatrixError", "UsageError"]


class ConvmatrixError(Exception):
    """Base of errors the CLI reports as one message; ``exit_code`` is the process status."""

    exit_code = 1


class UsageError(ConvmatrixError):
    """Bad arguments, a malformed matrix, an unknown kernel: exit status 2 (docs/spec.md §6)."""

    exit_code = 2
