"""``convmatrix serve``: the report pages, live from the database, at stable URLs.

Every page is a view-model from ``service.pages`` rendered through the report templates (the
static reports and the served pages cannot drift apart), and every page has its JSON at the
same path under ``/api`` (the view-model the static page writes beside its HTML)::

    /                             runs, filterable: ?kernel=&label=&device=&matrix=&since=&until=
    /runs/{run}                   a run (id, latest, label or commit, as on the command line)
    /diff/{base}/{head}           two runs matched by case id
    /history/{dtype}              one input dtype over the runs (?kernel=&output=&since=)
    /cases/{case_id}              one case across runs and commits, with its rerun command
    /regressions                  the regressions (?state=detected&state=confirmed&kernel=)

Read-only: the server never writes, nor migrates; a database behind the newest schema is
refused with the command that upgrades it. A name that matches nothing is a 404 with the
same one-line message the command line would print; malformed input (a 5000-digit run id,
``since=999999999999d``, an unknown filter or state, a control character) is a 400.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from convmatrix.core.errors import InputError, UsageError
from convmatrix.db.database import Database
from convmatrix.reports.history_view import load_history
from convmatrix.reports.render import content_policy, render_html
from convmatrix.reports.viewmodel import to_jsonable
from convmatrix.service import pages
from convmatrix.service.inputs import check_params

__all__ = ["create_app"]

Builder = Callable[[Session, str, Request], Any]


def _query(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


PAGES: dict[str, Builder] = {
    "/": lambda s, u, r: pages.runs_page(s, u, {k: v for k, v in r.query_params.items() if v}),
    "/runs/{run}": lambda s, u, r: pages.run_page(s, u, r.path_params["run"]),
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
    ),
    "/cases/{case_id}": lambda s, u, r: pages.case_page(
        s, u, r.path_params["case_id"], kernel=_query(r, "kernel")
    ),
    "/regressions": lambda s, u, r: pages.regressions_page(
        s, u, r.query_params.getlist("state"), kernel=_query(r, "kernel")
    ),
}


def create_app(db: str | None = None) -> Starlette:
    """The ASGI app serving ``db`` (default ``CONVMATRIX_DB``, else ``convmatrix.db``)."""
    database = Database.open(db, existing=True, upgrade=False)  # serve never writes
    engine, url = database.engine, database.url
    csp = content_policy(form_action="'self'")

    def endpoint(builder: Builder, as_json: bool) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:  # sync: Starlette runs it in a thread
            try:
                check_params([*request.path_params.items(), *request.query_params.multi_items()])
                with Session(engine) as session:
                    view = builder(session, url, request)
            except UsageError as err:  # malformed: 400; a name matching nothing: 404
                status = 400 if isinstance(err, InputError) else 404
                return PlainTextResponse(f"convmatrix serve: {err}\n", status_code=status)
            if as_json:
                return JSONResponse(to_jsonable(view))
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            html = render_html(view, served=True, request_path=path, csp=csp)
            return HTMLResponse(html, headers={"Content-Security-Policy": csp})

        return handle

    routes = []
    for path, builder in PAGES.items():
        routes.append(Route(path, endpoint(builder, False), methods=["GET"]))
        routes.append(Route("/api" + path, endpoint(builder, True), methods=["GET"]))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        database.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.url = url
    return app
