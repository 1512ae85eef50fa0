"""``convmatrix serve [--db URL] [--host 127.0.0.1] [--port 8000] [--token-file FILE]
[--allow-host NAME]``: the report pages, live.

The runs index, a run, a diff of any two runs, a dtype's history, one case's history, the
alerts and each alert and regression at stable URLs, each with its JSON under ``/api``
(``convmatrix.service.app``). Read-only unless a token is given (``--token-file``, else
``CONVMATRIX_SERVE_TOKEN``): then triage writes that carry it are accepted. Never migrates.
Needs the ``serve`` extra (Starlette, uvicorn).

The socket is bound here, before uvicorn starts, so that ``--port 0`` takes a free port and
the first line printed names it (what tests and scripts read, with no race for a port picked
beforehand), and so that the Host check knows the port requests must name.
"""

from __future__ import annotations

import argparse
import os
import socket

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.service.access import TOKEN_ENV, Hosts, read_token

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
    with _listen(args.host, args.port) as sock:
        port = sock.getsockname()[1]
        app = create_app(args.db, token=token, hosts=Hosts.bound(args.host, port, args.allow_host))
        mode = "triage with the token" if token else "read-only: no token"
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"convmatrix serve: http://{host}:{port}/ ({redact_url(app.state.url)}; {mode})",
            flush=True,
        )
        config = uvicorn.Config(app, log_level=args.log_level)
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (0: a free port); ``UsageError`` naming the
    option when it cannot be had (the port in use, an address not of this host)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise UsageError(f"--host {host}: not an address to listen on ({err})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UsageError(
            f"--host {host} --port {port}: cannot listen there: {err.strerror}"
        ) from None
    sock.set_inheritable(True)
    return sock


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
    parser.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help=(
            "a name requests may give in their Host header beside the address listened on "
            "(a proxy's; repeat for more; '*': any, which lets pages elsewhere read this "
            "server through DNS rebinding)"
        ),
    )
    parser.set_defaults(handler=serve_command)
