"""The ``convmatrix`` command: one module per subcommand under ``convmatrix.commands``.

Each command module exposes ``add_parser(subparsers)``, which registers a parser whose
``handler`` default takes the parsed namespace and returns the exit status. The modules are
listed here explicitly, in workflow order. Exit status: 0 all passed, 1 failures,
2 usage or configuration errors (SPEC.md §6).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from convmatrix.errors import ConvmatrixError

__all__ = ["main"]

COMMANDS = (
    "selfcheck",
    "kernels",
    "devices",
    "plan",
    "expand",
    "run",
    "report",
    "diff",
    "history",
    "db",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convmatrix",
        description="Test matrix and regression service for causal depthwise conv1d kernels.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"convmatrix.commands.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
