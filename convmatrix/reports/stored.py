"""A run's pages, built once when the run has finished and read back after (``db.pages``).

``StoredPages`` names one run; ``page(name, parts, build)`` returns the page ``name``: the stored
text when one was stored under the same stamp, else ``build(view)`` with the run's view-model
built from its results (once per ``StoredPages``), stored for the next reader when the run has
finished. ``parts`` are whatever the page shows beyond the view-model (the served pages' links
to regressions, the request path): a change in them is a new stamp, so a rebuild. The code's
version and the reports' modules and templates are part of every stamp: an upgraded or edited
convmatrix never serves pages an older one rendered.

Within one process a page being built is built once: concurrent requests for it wait for the
first and then read what it stored (a cold 10,000-case page costs seconds of CPU, eight of
them at once would cost eight times that).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine

from convmatrix.core import __version__
from convmatrix.db.engine import redact_url
from convmatrix.db.pages import keep_page, page_stamp, read_page, run_state
from convmatrix.db.queries import RunInfo
from convmatrix.reports.source import find_run, load_run

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader
    from convmatrix.reports.run_view import RunView

__all__ = ["StoredPages"]

_lock = threading.Lock()
_building: dict[tuple[int, str, str], threading.Lock] = {}


@cache
def code_version() -> str:
    """A digest of the convmatrix version and of the code that builds and renders a page (the
    ``convmatrix.reports`` modules and templates): a page kept by other code is rebuilt."""
    digest = hashlib.sha256(__version__.encode())
    package = resources.files("convmatrix.reports")
    for folder in (package, package.joinpath("templates")):
        for item in sorted(folder.iterdir(), key=lambda p: p.name):
            if item.is_file() and item.name.endswith((".py", ".html", ".css", ".js")):
                digest.update(item.name.encode() + b"\x00" + item.read_bytes())
    return digest.hexdigest()


class StoredPages:
    """One run's pages, read from where they are stored or built (see the module's text)."""

    def __init__(self, session: Reader, spec: str | int, url: str, *, what: str = "RUN"):
        self.session = session
        self.url = url
        self.info: RunInfo = find_run(session, str(spec), what=what)
        self.state = run_state(session, self.info.id)  # None: still changing, never stored
        self._view: RunView | None = None

    def view(self) -> RunView:
        """The run's view-model, built from every stored result (the expensive part)."""
        if self._view is None:
            from convmatrix.reports.run_view import build_run_view  # only when built

            loaded = load_run(self.session, str(self.info.id), self.url, info=self.info)
            self._view = build_run_view(loaded.header, loaded.results)
        return self._view

    def page(self, name: str, build: Callable[[RunView], str], parts: Iterable[object] = ()) -> str:
        """The page ``name`` (see the module's text)."""
        if self.state is None:
            return build(self.view())
        parts = (code_version(), redact_url(self.url), *parts)
        key = (self.info.id, name, page_stamp(self.state, parts))
        text = read_page(self.session, *key)
        if text is not None:
            return text
        reader = self.session
        bind = reader.engine if isinstance(reader, Connection) else reader.get_bind()
        if not isinstance(bind, Engine):  # a session on a caller's connection: store nothing
            return build(self.view())
        with _lock:
            building = _building.setdefault(key, threading.Lock())
        with building:  # one build per page at a time; the others wait, then read it
            try:
                with bind.connect() as fresh:  # the reader's snapshot may predate that store
                    text = read_page(fresh, *key)
                if text is None:
                    text = build(self.view())
                    keep_page(bind, *key, text)
            finally:
                with _lock:
                    _building.pop(key, None)
        return text
