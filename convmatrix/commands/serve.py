"""``convmatrix serve [--db URL] [--host 127.0.0.1] [--port 8000] [--token-file FILE]``: the
report pages, live.

The runs index, a run, a diff of any two runs, a dtype's history, one case's history, the
alerts and each alert and regression at stable URLs, each with its JSON under ``/api``
(``convmatrix.service.app``). Read-only unless a token is given (``--token-file``, else
``CONVMATRIX_SERVE_TOKEN``): then triage writes that carry it are accepted. Never migrates.
Needs the ``serve`` extra (Starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import os

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.service.access import TOKEN_ENV, read_token

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
    token = read_token(args.token_file, os.environ)
    app = create_app(args.db, token=token)
    mode = "triage with the token" if token else "read-only: no token"
    print(
        f"convmatrix serve: http://{args.host}:{args.port}/ ({redact_url(app.state.url)}; {mode})",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the runs, a run, diffs, dtype and case histories, the alerts and each alert and "
        "regression as web pages with their JSON, live from the database. Read-only unless "
        f"a token is given (--token-file, else {TOKEN_ENV}): then POST /api/regressions/ID "
        "and /api/alerts/ID with a JSON body and the header Authorization: Bearer TOKEN "
        "triage them (docs/regressions.md)."
    )
    add_db_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--log-level", default="warning", help="uvicorn's (default warning)")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help=(
            "a file holding the bearer token that triage writes must carry (whitespace "
            f"stripped; wins over {TOKEN_ENV}); without either the server is read-only"
        ),
    )
    parser.set_defaults(handler=serve_command)
