"""``convmatrix serve [--db URL] [--host 127.0.0.1] [--port 8000]``: the report pages, live.

The runs index, a run, a diff of any two runs, a dtype's history, one case's history and the
regressions at stable URLs, each with its JSON under ``/api`` (``convmatrix.service.app``).
Read-only on the database. Needs the ``serve`` extra (Starlette, uvicorn).
"""

from __future__ import annotations

import argparse

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError

__all__ = ["add_arguments", "serve_command"]


def serve_command(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from convmatrix.db.engine import redact_url
        from convmatrix.service.app import create_app
    except ImportError as err:
        raise UsageError(
            f"serve needs the serve extra: pip install 'convmatrix[serve]' ({err})"
        ) from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: give a port number from 0 to 65535")
    app = create_app(args.db)
    shown = redact_url(app.state.url)  # a terminal or a CI log is no place for a password
    print(f"convmatrix serve: http://{args.host}:{args.port}/ ({shown})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the runs, a run, diffs, dtype and case histories and the regressions as web "
        "pages with their JSON, live from the database (read-only)."
    )
    add_db_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--log-level", default="warning", help="uvicorn's (default warning)")
    parser.set_defaults(handler=serve_command)
