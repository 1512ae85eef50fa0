"""Who may change regressions through ``convmatrix serve``: the bearer token, and the checks
that keep a write from coming from another site.

The server is read-only unless it was started with a token (``--token-file FILE``, else the
environment's ``CONVMATRIX_SERVE_TOKEN``). With one, a write must

- come from this server's own pages or from a program, never from another site: a request
  whose ``Origin`` is not this server, or that a browser marks ``Sec-Fetch-Site: cross-site``
  (or ``same-site``: another origin of the same site), is refused;
- carry ``Authorization: Bearer <token>`` (compared in constant time): a cross-site form can
  set no such header, and a page elsewhere cannot read the token, which the triage form keeps
  in the tab's ``sessionStorage``, never in a cookie or the HTML;
- be JSON (``Content-Type: application/json``), which no plain HTML form can send.

Every refusal is one line saying why; the app answers it with 403.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from convmatrix.core.errors import UsageError

__all__ = ["TOKEN_ENV", "read_token", "write_refusal"]

TOKEN_ENV = "CONVMATRIX_SERVE_TOKEN"
READ_ONLY = (
    "read-only: this server was started without a token "
    f"(convmatrix serve --token-file FILE, or {TOKEN_ENV})"
)


def read_token(token_file: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> str | None:
    """The write token: the file's content (whitespace stripped) when a file is given, else
    ``CONVMATRIX_SERVE_TOKEN``; ``None``: no token, the server stays read-only. An empty or
    unreadable file is an error naming ``--token-file`` (a typo must not serve read-only, or
    worse, with an empty token)."""
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            raise UsageError(f"--token-file {path}: cannot read it: {reason}") from None
        if not token:
            raise UsageError(f"--token-file {path}: the file is empty; put the token in it")
        _check(token, f"--token-file {path}")
        return token
    token = (environ.get(TOKEN_ENV) or "").strip()
    if not token:
        return None
    _check(token, TOKEN_ENV)
    return token


def _check(token: str, where: str) -> None:
    if any(c.isspace() for c in token) or not token.isprintable() or not token.isascii():
        raise UsageError(f"{where}: a token is one word of printable ASCII characters")


def _sent_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def write_refusal(token: str | None, headers: Mapping[str, str], origin: str) -> str | None:
    """Why a write with these request ``headers`` (lower-case names) is refused, or ``None``;
    ``origin`` is this server as the request reached it (``http://host:port``)."""
    if token is None:
        return READ_ONLY
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"refused: a {site} request (Sec-Fetch-Site); writes come from this server's pages"
    sent_origin = headers.get("origin")
    if sent_origin is not None and sent_origin.rstrip("/") != origin:
        return f"refused: Origin {sent_origin} is not this server ({origin})"
    sent = _sent_token(headers.get("authorization"))
    if sent is None:
        return "refused: a write needs the header Authorization: Bearer <token>"
    if not hmac.compare_digest(sent.encode("utf-8"), token.encode("utf-8")):
        return "refused: wrong token"
    return None
