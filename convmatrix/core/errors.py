"""Errors that end a command cleanly with an exit code instead of a traceback."""

from __future__ import annotations

__all__ = [
    "EXIT_CODES",
    "ConvmatrixError",
    "InfrastructureError",
    "InputError",
    "NotJudgedError",
    "UsageError",
    "exit_table",
    "machine_fault",
]


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


class NotJudgedError(ConvmatrixError):
    """Nothing was judged: the kernel could not be loaded (its module raised on import), a
    run judged fewer than ``--min-judged`` of its planned cases, or ``bisect`` cannot name a
    first bad commit among the commits it judged. Exit status 4, so neither CI nor
    ``git bisect`` takes a run that judged nothing for a pass (or for a failure)."""

    exit_code = 4


# Every exit status of the command line, documented once: ``convmatrix --help`` prints this
# table (cli.py), README.md and docs/cli.md repeat it (tests/test_docs_cli.py checks them).
EXIT_CODES = {
    0: "ok: every case judged passed (skips allowed), or the command did what it was asked",
    1: "failures: a case failed, crashed, timed out or errored, a new regression, a run "
    "stopped early or a sharded run missing a shard",
    2: "usage: a bad argument, matrix, kernel name or environment variable (nothing ran)",
    3: "infrastructure: the database, the executor (xdist, Ray) or the machine (threads, "
    "devices) failed; results a run could not store are in its journal",
    4: "nothing judged: the kernel could not be loaded, fewer than --min-judged of the "
    "planned cases were judged, or bisect cannot decide",
    130: "interrupted (SIGINT or SIGTERM)",
}


def exit_table(width: int = 88) -> str:
    """``EXIT_CODES`` as the lines ``--help`` shows (``    0  ok: ...``, wrapped)."""
    import textwrap

    return "\n".join(
        textwrap.fill(text, width, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, text in EXIT_CODES.items()
    )


def machine_fault(text: str) -> str | None:
    """What the machine refused, when ``text`` (an exception's message, a traceback) shows
    the process out of a resource no kernel is to blame for, else None: ``threading`` raises
    ``RuntimeError("can't start new thread")`` when the process may start no more threads
    or has no memory left for a thread's stack (explore once ended so, as if it had found a
    failure)."""
    if "can't start new thread" in text:
        return "the machine would not start a thread (out of threads or memory for a stack)"
    return None
