"""``convmatrix serve``: the report pages, live from the database, at stable URLs.

Every page is a view-model from ``service.pages`` or ``service.alert_pages`` rendered through
the report templates (the static reports and the served pages cannot drift apart), and every
page has its JSON at the same path under ``/api`` (the view-model the static page writes beside
its HTML)::

    /                             runs, filterable: ?kernel=&label=&device=&matrix=&since=&until=
    /runs/{run}                   a run (id, latest, label or commit, as on the command line)
    /diff/{base}/{head}           two runs matched by case id (/diff?base=&head=: the picker)
    /history/{dtype}              one input dtype over the runs (?kernel=&matrix=&output=&since=)
    /cases/{case_id}              one case across runs and commits, with its rerun command
    /regressions                  the alerts, newest first (?state=detected&state=confirmed&kernel=)
    /alerts/{id}                  one alert: its cases, why, history, rerun, bisection, events
    /regressions/{id}             one regression: its outputs, history, rerun, events

Writes (triage) are ``POST /api/regressions/{id}`` and ``POST /api/alerts/{id}`` with a JSON
body (``service.triage_api``), allowed only when the server has a token and the request carries
it and comes from no other site (``service.access``); without a token the server is read-only
and every write answers 403, and wrong tokens are throttled (429). Every request must name this
server in its Host header (421 otherwise: ``access.Hosts``). It never migrates: a database
behind the newest schema is refused with the command that upgrades it. A name that matches
nothing is a 404 with the same one-line message the command line would print, an id that
names no row (``²``, past BIGINT) too; malformed input (a 5000-digit run id,
``since=999999999999d``, an unknown filter or state, a control character, a lone surrogate)
is a 400 (``service.inputs``), a body over ``MAX_BODY`` a 413: never a 500 or 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from convmatrix.core.errors import InputError, UsageError
from convmatrix.db.database import Database
from convmatrix.db.engine import connection_error
from convmatrix.reports.history_view import load_history
from convmatrix.reports.render import content_policy, render_html
from convmatrix.reports.stored import StoredPages
from convmatrix.reports.viewmodel import json_text, to_jsonable
from convmatrix.service import alert_pages, pages
from convmatrix.service.access import Hosts, Refusal, Throttle, check_token, write_refusal
from convmatrix.service.inputs import check_ids, check_params, parse_id
from convmatrix.service.regressions import TRANSITIONS
from convmatrix.service.triage_api import (
    MAX_BODY,
    BadRequest,
    NotFound,
    parse_change,
    triage_alert,
    triage_regression,
)

__all__ = ["create_app"]

Builder = Callable[[Session, str, Request], Any]  # a page's view-model
Page = Callable[[Session, Request, bool], Response]  # a page (True: its JSON)


def _query(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


PAGES: dict[str, Builder] = {
    "/": lambda s, u, r: pages.runs_page(s, u, {k: v for k, v in r.query_params.items() if v}),
    "/diff/{base}/{head}": lambda s, u, r: pages.diff_page(
        s, u, r.path_params["base"], r.path_params["head"]
    ),
    "/history/{dtype}": lambda s, u, r: load_history(
        s,
        u,
        r.path_params["dtype"],
        kernel=_query(r, "kernel"),
        output=_query(r, "output"),
        since=_query(r, "since"),
        matrix=_query(r, "matrix"),
    ),
    "/cases/{case_id}": lambda s, u, r: pages.case_page(
        s, u, r.path_params["case_id"], kernel=_query(r, "kernel")
    ),
    "/regressions": lambda s, u, r: alert_pages.alerts_page(
        s, u, r.query_params.getlist("state"), kernel=_query(r, "kernel")
    ),
    "/alerts/{alert_id}": lambda s, u, r: alert_pages.alert_page(s, u, r.path_params["alert_id"]),
    "/regressions/{regression_id}": lambda s, u, r: alert_pages.regression_page(
        s, u, r.path_params["regression_id"]
    ),
}

WRITES = {"/api/regressions/{id}": triage_regression, "/api/alerts/{id}": triage_alert}


def _refused(status: int, reason: str, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return PlainTextResponse(f"convmatrix serve: {reason}\n", status_code=status, headers=headers)


def _refusal(refusal: Refusal) -> Response:
    return _refused(refusal.status, refusal.reason, refusal.retry_after)


class _HostCheck:
    """Every HTTP request's Host header checked before anything else (``access.Hosts``)."""

    def __init__(self, app: ASGIApp, hosts: Hosts) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.hosts.refusal(Headers(scope=scope).get("host"))
            if refusal is not None:
                await _refusal(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _body(request: Request) -> bytes | None:
    """The request's body, or ``None`` when it is over ``MAX_BODY`` (not read further)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return None
    return body


def create_app(
    db: str | None = None,
    *,
    token: str | None = None,
    hosts: Hosts | None = None,
    throttle: Throttle | None = None,
) -> Starlette:
    """The ASGI app serving ``db`` (default ``CONVMATRIX_DB``, else ``convmatrix.db``);
    ``token``: the bearer token writes need (``None``: read-only); ``hosts``: the Host
    headers it answers (``None``: any; ``convmatrix serve`` always gives the bound address,
    an app mounted elsewhere is behind whatever checks them there); ``throttle``: of wrong
    tokens (default ``Throttle()``)."""
    if token is not None:
        check_token(token, "the token")
    throttle = throttle or Throttle()
    database = Database.open(db, existing=True, upgrade=False)  # serve never migrates
    engine, url = database.engine, database.url
    csp = content_policy(form_action="'self'", connect_src="'self'")
    # Only a header can forbid framing (a <meta> policy may not say frame-ancestors).
    headers = {
        "Content-Security-Policy": csp + "; frame-ancestors 'none'",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
    }
    writable = token is not None

    def endpoint(page: Page, as_json: bool) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:  # sync: Starlette runs it in a thread
            try:
                check_params([*request.path_params.items(), *request.query_params.multi_items()])
                check_ids(request.path_params)
                with Session(engine) as session:
                    return page(session, request, as_json)
            except UsageError as err:  # malformed: 400; a name matching nothing: 404
                return _refused(400 if isinstance(err, InputError) else 404, str(err))

        return handle

    def render(view: Any, path: str, extra: dict[str, Any]) -> str:
        return render_html(
            view, served=True, request_path=path, csp=csp, writable=writable,
            transitions=TRANSITIONS, **extra,
        )  # fmt: skip

    def built(builder: Builder) -> Page:
        """A page built from the database on every request."""

        def page(session: Session, request: Request, as_json: bool) -> Response:
            view = builder(session, url, request)
            if as_json:
                return JSONResponse(to_jsonable(view))
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            html = render(view, path, pages.served_context(session, view))
            return HTMLResponse(html, headers=headers)

        return page

    def run_page(session: Session, request: Request, as_json: bool) -> Response:
        """A run's page, stored once it has finished (``reports.stored``): its JSON, and its
        HTML per address (the address is in its JSON link; a query changes nothing on it)."""
        stored = StoredPages(session, request.path_params["run"], url)
        if as_json:
            return Response(stored.page("run.json", json_text), media_type="application/json")
        path, info = request.url.path, stored.info
        links = pages.run_links(session, info)  # what can change on a finished run's page
        name = f"served{' writable' if writable else ''} {path}"
        html = stored.page(
            name, lambda view: render(view, path, pages.run_context(session, info, links)),
            (csp, links),
        )  # fmt: skip
        return HTMLResponse(html, headers=headers)

    def compare(request: Request) -> Response:
        """The runs index's picker: ``/diff?base=A&head=B`` is ``/diff/A/B``."""
        base, head = _query(request, "base"), _query(request, "head")
        if base is None or head is None:
            return _refused(400, "/diff needs two runs: /diff?base=RUN&head=RUN")
        return RedirectResponse(f"/diff/{quote(base, safe='')}/{quote(head, safe='')}", 303)

    def write(action: Callable[..., alert_pages.TriageResult]) -> Callable[..., Any]:
        async def handle(request: Request) -> Response:
            origin = f"{request.url.scheme}://{request.url.netloc}"
            client = request.client.host if request.client else ""
            refusal = write_refusal(token, request.headers, origin, throttle=throttle,
                                    client=client)  # fmt: skip
            if refusal is not None:
                return _refusal(refusal)
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return _refused(415, f"send JSON (Content-Type: application/json), not {kind!r}")
            body = await _body(request)
            if body is None:
                return _refused(413, f"the body is over {MAX_BODY} bytes")
            target = parse_id(request.path_params["id"])
            if target is None:
                return _refused(
                    404, f"{request.path_params['id'][:40]!r}: no such id (give a number)"
                )
            try:
                change = parse_change(body, request.headers.get("x-convmatrix-user"))
                result = await run_in_threadpool(_write, action, target, change)
            except NotFound as err:
                return _refused(404, str(err))
            except BadRequest as err:
                return _refused(400, str(err))
            except SQLAlchemyError as err:  # locked past the busy timeout, read-only, gone
                return _refused(503, f"nothing changed: {connection_error(engine, err)}")
            return JSONResponse(to_jsonable(result))

        return handle

    def _write(action: Callable[..., Any], target: int, change: Any) -> Any:
        with database.writing() as session:
            return action(session, target, change)

    routes = [Route("/diff", compare, methods=["GET"])]
    served: dict[str, Page] = {path: built(builder) for path, builder in PAGES.items()}
    served["/runs/{run}"] = run_page
    for path, page in served.items():
        routes.append(Route(path, endpoint(page, False), methods=["GET"]))
        routes.append(Route("/api" + path, endpoint(page, True), methods=["GET"]))
    for path, action in WRITES.items():
        routes.append(Route(path, write(action), methods=["POST"]))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        database.close()

    middleware = [Middleware(_HostCheck, hosts=hosts)] if hosts is not None else []
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.url = url
    app.state.writable = writable
    return app
