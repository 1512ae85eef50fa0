"""Who may use ``convmatrix serve``: the Host a request names, the bearer token a write
carries, the checks that keep a write from coming from another site, and the throttle on
wrong guesses.

- **Host** (every request): the ``Host`` header must name this server, its bound address
  and port (``Hosts``), else 421. Without this check a page on another site could read a
  server listening on 127.0.0.1 through DNS rebinding: its own name made to resolve to
  127.0.0.1, the browser would send it the pages as same-origin. A server listening on every
  address (``0.0.0.0``) answers any IP address, its host names and ``localhost``; names it
  is reached by otherwise (a proxy's) are given with ``--allow-host``.
- **Token**: the server is read-only unless it was started with one (``--token-file FILE``,
  else ``CONVMATRIX_SERVE_TOKEN``): one word of 16 to 1024 printable ASCII characters (a
  short one can be guessed, a longer one could never be sent in a header). The file is read
  no further than that (``--token-file /dev/zero`` is an error, not a MemoryError).
- **A write** must come from this server's own pages or from a program, never from another
  site: a request whose ``Origin`` is not this server, or that a browser marks
  ``Sec-Fetch-Site: cross-site`` (or ``same-site``), is refused. It must carry
  ``Authorization: Bearer <token>``, compared in constant time (the SHA-256 of each, so not
  even the length leaks): a cross-site form can set no such header, and a page elsewhere
  cannot read the token, which the triage form keeps in the tab's ``sessionStorage``. It
  must be JSON (``service.app``), which no plain HTML form can send.
- **Guesses**: after ``Throttle.limit`` wrong tokens from one client address within
  ``Throttle.window_s``, every write from it is answered 429 (with ``Retry-After``) until
  the window has passed, the right token included: a guesser gets a handful of tries a
  minute, not thousands a second.

Every refusal is one line saying why (``Refusal``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from convmatrix.core.errors import UsageError

__all__ = [
    "MAX_TOKEN",
    "MIN_TOKEN",
    "TOKEN_ENV",
    "Hosts",
    "Refusal",
    "Throttle",
    "check_token",
    "read_token",
    "write_refusal",
]

TOKEN_ENV = "CONVMATRIX_SERVE_TOKEN"
MIN_TOKEN = 16  # characters: 16 random ones are ~95 bits from a password generator
MAX_TOKEN = 1024  # characters: sent in a header, which servers cap at a few KiB
_FILE_LIMIT = 4 * MAX_TOKEN  # bytes of --token-file read: the token, whitespace around it
READ_ONLY = (
    "read-only: this server was started without a token "
    f"(convmatrix serve --token-file FILE, or {TOKEN_ENV})"
)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, and the HTTP status that says so."""

    status: int
    reason: str
    retry_after: int | None = None  # seconds (429)


def read_token(token_file: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> str | None:
    """The write token: the file's content (whitespace stripped) when a file is given, else
    ``CONVMATRIX_SERVE_TOKEN``; ``None``: no token, the server stays read-only. An empty,
    unreadable, oversized or malformed one is an error naming ``--token-file`` (a typo must
    not serve read-only, or worse, with a token anyone can guess)."""
    if token_file is None:
        token = (environ.get(TOKEN_ENV) or "").strip()
        return check_token(token, TOKEN_ENV) if token else None
    path = Path(token_file)
    where = f"--token-file {path}"
    try:
        with path.open("rb") as stream:
            data = stream.read(_FILE_LIMIT + 1)
    except OSError as err:
        raise UsageError(f"{where}: cannot read it: {err.strerror or err}") from None
    if len(data) > _FILE_LIMIT:
        raise UsageError(f"{where}: over {_FILE_LIMIT} bytes; a token is one line")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text; a token is printable ASCII") from None
    if not token:
        raise UsageError(f"{where}: the file is empty; put the token in it")
    return check_token(token, where)


def check_token(token: str, where: str) -> str:
    """``token`` when it is one word of ``MIN_TOKEN`` to ``MAX_TOKEN`` printable ASCII
    characters; else ``UsageError`` naming ``where`` (the option or variable it came from)."""
    if any(c.isspace() for c in token) or not token.isprintable() or not token.isascii():
        raise UsageError(f"{where}: a token is one word of printable ASCII characters")
    if not MIN_TOKEN <= len(token) <= MAX_TOKEN:
        raise UsageError(
            f"{where}: the token has {len(token)} characters; give {MIN_TOKEN} to {MAX_TOKEN} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def _sent_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header; ``None`` for none or an empty
    one (never compared: an empty string is a prefix of every token)."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _same(sent: str, token: str) -> bool:
    digest = hashlib.sha256
    return hmac.compare_digest(digest(sent.encode()).digest(), digest(token.encode()).digest())


@dataclass
class Throttle:
    """Wrong tokens per client address: ``limit`` within ``window_s`` seconds, then every
    write from that address waits out the window (429). At most ``clients`` addresses are
    remembered, the oldest forgotten first, so a flood of addresses costs bounded memory.
    Used from the event loop only (no lock)."""

    limit: int = 10
    window_s: float = 60.0
    clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def wait(self, client: str) -> float:
        """Seconds before ``client`` may try again (0: now)."""
        failures = self._failures.get(client)
        if failures is None:
            return 0.0
        now = self.clock()
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0.0
        return failures[0] + self.window_s - now if len(failures) >= self.limit else 0.0

    def failed(self, client: str) -> None:
        failures = self._failures.pop(client, None) or deque(maxlen=self.limit)
        failures.append(self.clock())
        self._failures[client] = failures  # newest last: the oldest are forgotten first
        while len(self._failures) > self.clients:
            del self._failures[next(iter(self._failures))]


def write_refusal(
    token: str | None,
    headers: Mapping[str, str],
    origin: str,
    *,
    throttle: Throttle | None = None,
    client: str = "",
) -> Refusal | None:
    """Why a write with these request ``headers`` (lower-case names) is refused, or ``None``;
    ``origin`` is this server as the request reached it (``http://host:port``), ``client``
    the address the request came from (what ``throttle`` counts wrong tokens by)."""
    if token is None:
        return Refusal(403, READ_ONLY)
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return Refusal(
            403, f"refused: a {site} request (Sec-Fetch-Site); writes come from this server's pages"
        )
    sent_origin = headers.get("origin")
    if sent_origin is not None and sent_origin.rstrip("/") != origin:
        return Refusal(403, f"refused: Origin {sent_origin} is not this server ({origin})")
    wait = throttle.wait(client) if throttle is not None else 0.0
    if wait > 0:
        return Refusal(429, "refused: too many wrong tokens from this address; wait",
                       retry_after=math.ceil(wait))  # fmt: skip
    sent = _sent_token(headers.get("authorization"))
    if sent is None:
        return Refusal(403, "refused: a write needs the header Authorization: Bearer <token>")
    if not _same(sent, token):
        if throttle is not None:
            throttle.failed(client)
        return Refusal(403, "refused: wrong token")
    return None


_WILDCARDS = ("", "0.0.0.0", "::")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _split_host(header: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header; ``None`` when it is not one."""
    if header.startswith("["):  # [IPv6]:port
        name, _, rest = header[1:].partition("]")
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        name, _, port = header.partition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return name.lower().rstrip("."), int(port) if port else None


@dataclass(frozen=True)
class Hosts:
    """The Host header values a server answers: ``names`` on its ``port`` (a header without
    a port means 80), any IP address too when it listens on all of them, and ``anywhere``
    names (``--allow-host``) on any port, a proxy's. ``open``: no check at all."""

    names: frozenset[str]
    port: int
    any_address: bool = False
    anywhere: frozenset[str] = frozenset()
    open: bool = False

    @classmethod
    def bound(cls, host: str, port: int, allow: Iterable[str] = ()) -> Hosts:
        """What a server listening on ``host``:``port`` answers (``allow``: ``--allow-host``
        names; ``*`` turns the check off)."""
        allow = [a.strip().lower().rstrip(".") for a in allow]
        names = {host.strip("[]").lower(), "localhost"}
        address = _ip(host.strip("[]"))
        wildcard = host in _WILDCARDS
        if wildcard:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        elif host.lower() != "localhost" and not (address is not None and address.is_loopback):
            names.discard("localhost")
        if host.lower() == "localhost":
            names |= {"127.0.0.1", "::1"}
        return cls(frozenset(names), port, any_address=wildcard,
                   anywhere=frozenset(a for a in allow if a != "*"), open="*" in allow)  # fmt: skip

    def refusal(self, header: str | None) -> Refusal | None:
        """Why a request with this Host header is refused (421), or ``None``."""
        if self.open:
            return None
        if not header:
            return Refusal(400, "refused: a request needs a Host header")
        parsed = _split_host(header.strip())
        if parsed is not None:
            name, port = parsed
            if name in self.anywhere:
                return None
            right_port = (80 if port is None else port) == self.port
            if right_port and (name in self.names or (self.any_address and _ip(name))):
                return None
        return Refusal(
            421, f"refused: Host {header[:100]!r} is not this server (convmatrix serve "
            "answers the address it listens on; --allow-host NAME for another name)",
        )  # fmt: skip
