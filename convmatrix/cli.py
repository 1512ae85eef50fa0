"""The ``convmatrix`` command: one module per subcommand under ``convmatrix.commands``.

The commands are listed here, in workflow order, with the line ``convmatrix --help`` shows.
Each module exposes ``add_arguments(parser)``, which defines its arguments and a ``handler``
default that takes the parsed namespace and returns the exit status. Only the chosen
command's module is imported: ``convmatrix --help`` imports none, ``convmatrix history``
never imports torch (benchmarks/bench_startup.py measures it).

Exit status: one table every command follows (``core.errors.EXIT_CODES``, printed by
``convmatrix --help``): 0 ok, 1 failures or regressions, 2 usage, 3 infrastructure (the
database, the executor, the machine: a database unreachable at start, a Ray address where
nothing listens, a thread the system would not start), 4 nothing judged, 130 interrupted.
Whatever ends a command ends it in one line: a ``ConvmatrixError`` with its own status, a
database error or a machine out of threads with 3.

Every declared environment variable (``core.environment``) is checked once, before the
command runs. Every command that owns its process ends it with ``os._exit`` once its work is
done, skipping the interpreter's teardown (0.55 s with torch loaded: ``core.ending``). A
``convmatrix run -n 0`` runs the kernel in this process: whatever threads or ``atexit`` hooks
the kernel left, the process ends with the run's status once the run is recorded and the
output flushed, instead of waiting on them forever; every other command joins its threads
and runs its hooks first.
"""

from __future__ import annotations

import argparse
import importlib
import keyword
import sys
from collections.abc import Sequence

from convmatrix.core.ending import end_process, threads_left
from convmatrix.core.environment import check_environment
from convmatrix.core.errors import ConvmatrixError, InfrastructureError, exit_table, machine_fault

__all__ = ["COMMANDS", "build_parser", "main", "module_name"]

COMMANDS = {
    "selfcheck": "check the float64 reference against itself",
    "kernels": "list registered kernels and their availability",
    "devices": "list cpu/cuda/mlu devices and what a run would use",
    "plan": "rank tile sizes for an on-chip memory budget",
    "expand": "list the cases a matrix yields for a kernel",
    "run": "run a matrix against a kernel and record the results",
    "cache": "show or clear the reference cache runs read and write",
    "adequacy": "measure a matrix: which seeded bugs its cases kill",
    "explore": "search beyond the matrix: drawn cases, failures shrunk",
    "shrink": "shrink a run's failing case to the simplest one failing the same way",
    "confirm": "rerun a run's failing and regressed cases: confirmed or flaky",
    "regressions": "list, scan and update the regressions of the recorded runs",
    "report": "write the HTML report of one run",
    "ci-report": "write the JUnit XML and job summary of a whole (sharded) run",
    "diff": "compare two runs (two kernel commits) case by case",
    "history": "error history of one dtype over the runs",
    "bisect": "find the kernel commit that broke a case (git bisect run)",
    "serve": "serve the report pages live from the database",
    "export": "write runs as JSON lines (to move them between databases)",
    "import": "read runs written by export into the database",
    "db": "create or upgrade the results database's schema",
}


def module_name(command: str) -> str:
    """The module of ``command``: ``convmatrix.commands.<command>``, with an underscore after
    a Python keyword (``import`` lives in ``import_.py``) and for a dash (``ci_report``)."""
    name = command.replace("-", "_")
    return f"convmatrix.commands.{name}" + ("_" if keyword.iskeyword(name) else "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command listed and ``command``'s arguments defined (its module
    imported); without one, just the list (what ``--help`` and a typo need)."""
    parser = argparse.ArgumentParser(
        prog="convmatrix",
        description="Test matrix and regression service for causal depthwise conv1d kernels.",
        epilog=f"exit status (every command):\n{exit_table()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        child = sub.add_parser(name, help=summary)
        if name == command:
            importlib.import_module(module_name(name)).add_arguments(child)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command named in ``argv``: its first word (the top level takes no other)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def _database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the database's (a SQLAlchemy error: a server gone, a disk full)
    without importing SQLAlchemy to ask."""
    return any(k.__module__.startswith("sqlalchemy.") for k in type(exc).__mro__)


def _run(args: argparse.Namespace) -> int:
    try:
        check_environment()
        return int(args.handler(args))
    except ConvmatrixError as exc:
        print(f"convmatrix {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"convmatrix {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        what = _infrastructure(exc)
        if what is None:
            raise
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        print(f"convmatrix {args.command}: error: {what}: {reason}", file=sys.stderr)
        return InfrastructureError.exit_code


def _infrastructure(exc: BaseException) -> str | None:
    """What failed under the command when ``exc`` is the machine's or the database's, not the
    program's: a SQLAlchemy error, or a thread the system would not start (``threading``
    raises ``RuntimeError("can't start new thread")`` when the process is out of threads or
    memory for a stack); None for anything else (a bug: its traceback is shown)."""
    if _database_error(exc):
        return "database failure"
    fault = machine_fault(str(exc)) if isinstance(exc, RuntimeError) else None
    return fault.split(" (")[0] if fault else None


def _say_threads_left(command: str) -> None:
    """Name the threads a kernel run in this process left, which its end does not wait on."""
    left = [t.name for t in threads_left()]
    if left:
        names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        print(
            f"convmatrix {command}: exiting without waiting for {len(left)} thread(s) the "
            f"kernel left running ({names})",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. Called without ``argv`` (the console script,
    ``python -m convmatrix``) the process is the command's and ends here, with no teardown
    (``core.ending``; see the module's docstring)."""
    owns_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command(argv)).parse_args(argv)
    code = _run(args)
    if owns_process:
        ran_kernel = bool(getattr(args, "in_process_kernel", False))
        if ran_kernel:
            _say_threads_left(args.command)
        end_process(code, ran_kernel=ran_kernel)
    return code


if __name__ == "__main__":
    sys.exit(main())
