"""The ``convmatrix`` command: one module per subcommand under ``convmatrix.commands``.

The commands are listed here, in workflow order, with the line ``convmatrix --help`` shows.
Each module exposes ``add_arguments(parser)``, which defines its arguments and a ``handler``
default that takes the parsed namespace and returns the exit status. Only the chosen
command's module is imported: ``convmatrix --help`` imports none, ``convmatrix history``
never imports torch (benchmarks/bench_startup.py measures it). Exit status: 0 all passed,
1 failures, 2 usage or configuration errors (docs/spec.md §6).
"""

from __future__ import annotations

import argparse
import importlib
import keyword
import sys
from collections.abc import Sequence

from convmatrix.core.errors import ConvmatrixError

__all__ = ["COMMANDS", "build_parser", "main", "module_name"]

COMMANDS = {
    "selfcheck": "check the float64 reference against itself",
    "kernels": "list registered kernels and their availability",
    "devices": "list cpu/cuda/mlu devices and what a run would use",
    "plan": "rank tile sizes for an on-chip memory budget",
    "expand": "list the cases a matrix yields for a kernel",
    "run": "run a matrix against a kernel and record the results",
    "adequacy": "measure a matrix: which seeded bugs its cases kill",
    "confirm": "rerun a run's failing and regressed cases: confirmed or flaky",
    "regressions": "list, scan and update the regressions of the recorded runs",
    "report": "write the HTML report of one run",
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
    a Python keyword (``import`` lives in ``import_.py``)."""
    return f"convmatrix.commands.{command}" + ("_" if keyword.iskeyword(command) else "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command listed and ``command``'s arguments defined (its module
    imported); without one, just the list (what ``--help`` and a typo need)."""
    parser = argparse.ArgumentParser(
        prog="convmatrix",
        description="Test matrix and regression service for causal depthwise conv1d kernels.",
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command(argv)).parse_args(argv)
    try:
        return int(args.handler(args))
    except ConvmatrixError as exc:
        print(f"convmatrix {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"convmatrix {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
