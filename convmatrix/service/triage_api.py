"""The write side of ``convmatrix serve``: triage through ``POST /api/regressions/{id}`` and
``POST /api/alerts/{id}`` (an alert: the same change to each of its regressions).

The body is a JSON object with any of ``state``, ``note``, ``assignee``, ``bug`` (and ``by``,
who makes the change, else the ``X-Convmatrix-User`` header, else ``web``): acknowledge, ignore
or call invalid (with a note saying why), assign, link a bug, note something, reopen (state
``detected``). Each change is an event with who and when (``service.regressions.triage``).
Whether the request may write at all is ``service.access``'s business; here a body that is not
such an object is a ``BadRequest``, an unknown id ``NotFound``, and a move ``TRANSITIONS`` does
not allow, or an ignore without a reason, a ``BadRequest`` with the lifecycle's own message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from convmatrix.core.errors import InputError, UsageError
from convmatrix.db.models import AlertRow, RegressionRow
from convmatrix.db.regression_queries import lock_alert_regressions
from convmatrix.service.alert_pages import TriageResult, triage_result
from convmatrix.service.inputs import check_text
from convmatrix.service.regressions import TRANSITIONS, list_regressions, triage

__all__ = [
    "FIELDS",
    "MAX_BODY",
    "MAX_DEPTH",
    "BadRequest",
    "Change",
    "NotFound",
    "parse_change",
    "triage_alert",
    "triage_regression",
]

FIELDS = ("state", "note", "assignee", "bug", "by")
MAX_BODY = 64 * 1024  # bytes: a note, not a document
MAX_DEPTH = 20  # nesting of arrays and objects; a good body is one flat object
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[^\[\]{}]")
_LIMITS = {"state": 32, "note": 10_000, "assignee": 200, "bug": 2_000, "by": 200}


class BadRequest(UsageError):
    """The request cannot be done as asked (400)."""


class NotFound(UsageError):
    """No such alert or regression (404)."""


@dataclass(frozen=True)
class Change:
    """One person's change, as ``service.regressions.triage`` takes it."""

    by: str
    state: str | None = None
    note: str | None = None
    assignee: str | None = None  # "" unassigns
    bug: str | None = None  # "" removes the link

    def apply(self, session: Session, regression_id: int) -> None:
        triage(session, regression_id, by=self.by, state=self.state, note=self.note,
               assignee=self.assignee, bug=self.bug)  # fmt: skip


def _depth(text: str) -> int:
    """How deep ``text``'s arrays and objects nest (its strings skipped): checked before
    parsing, as a body of 30,000 ``[`` fits in ``MAX_BODY`` and would end the parser in a
    RecursionError."""
    depth = deepest = 0
    for c in _BRACKETS.sub("", _STRINGS.sub('""', text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _number(text: str) -> Any:
    """A JSON number, refused when longer than any a body needs (a 5000-digit integer is a
    ValueError in ``int``); every field takes a string anyway."""
    if len(text) > 40:
        raise BadRequest(f"a number of {len(text)} characters: every field takes a string")
    return float(text) if any(c in text for c in ".eE") else int(text)


def _constant(name: str) -> Any:
    raise BadRequest(f"{name} is not JSON: every field takes a string")


def _load(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"the body is not UTF-8 JSON: {err}") from None
    if _depth(text) > MAX_DEPTH:
        raise BadRequest(f"the body nests deeper than {MAX_DEPTH}: send a flat JSON object")
    try:
        return json.loads(text, parse_int=_number, parse_float=_number,
                          parse_constant=_constant)  # fmt: skip
    except (json.JSONDecodeError, RecursionError, ValueError) as err:
        raise BadRequest(f"the body is not JSON: {err}"[:200]) from None


def parse_change(body: bytes, user_header: str | None) -> Change:
    """The change a request body asks for; ``BadRequest`` naming what is wrong with it."""
    data = _load(body)
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object with any of {', '.join(FIELDS)}")
    unknown = sorted(k for k in data if k not in FIELDS)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0][:40]!r}: give any of {', '.join(FIELDS)}")
    values: dict[str, str | None] = {}
    for name in FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{name}: give a string, not {json.dumps(value)[:40]}")
        if value is not None and len(value) > _LIMITS[name]:
            raise BadRequest(f"{name}: at most {_LIMITS[name]} characters")
        if value is not None:
            _text(name, value)
        values[name] = value.strip() if value is not None else None
    state = values["state"] or None
    if state is not None and state not in TRANSITIONS:
        raise BadRequest(f"state {state!r}: choose from {', '.join(TRANSITIONS)}")
    note = values["note"] or None  # an empty note says nothing
    by = values["by"] or (user_header or "").strip() or "web"
    if len(by) > _LIMITS["by"] or not by.isprintable():
        raise BadRequest(f"by {by[:40]!r}: a name of at most 200 printable characters")
    change = Change(by=by, state=state, note=note, assignee=values["assignee"], bug=values["bug"])
    if (change.state, change.note, change.assignee, change.bug) == (None, None, None, None):
        raise BadRequest("nothing to change: give any of state, note, assignee, bug")
    return change


def _text(name: str, value: str) -> None:
    try:
        check_text(name, value, lines=name == "note")
    except InputError as err:
        raise BadRequest(str(err)) from None


def triage_regression(session: Session, regression_id: int, change: Change) -> TriageResult:
    """Apply ``change`` to one regression; the caller commits."""
    if session.get(RegressionRow, regression_id) is None:
        raise NotFound(f"regression {regression_id}: no such regression")
    try:
        change.apply(session, regression_id)
    except UsageError as err:
        raise BadRequest(str(err)) from None
    return triage_result(session, [regression_id])


def triage_alert(session: Session, alert_id: int, change: Change) -> TriageResult:
    """Apply ``change`` to every regression of an alert that can make its move; the others
    are left as they are and listed (``skipped``). Nothing changes when none can (a
    ``BadRequest``) or when any refuses (an ignore without a reason): one transaction."""
    if session.get(AlertRow, alert_id) is None:
        raise NotFound(f"alert {alert_id}: no such alert")
    # Its regressions locked (in id order, as every writer takes them) before their states
    # are read: which can move is decided on the states the moves apply to.
    lock_alert_regressions(session, alert_id)
    regressions = sorted(list_regressions(session, alert_ids=[alert_id]), key=lambda r: r.id)
    if not regressions:
        raise BadRequest(f"alert {alert_id} holds no regression")
    skipped: list[dict[str, Any]] = []
    changed: list[int] = []
    for reg in regressions:
        state = change.state
        if state is not None and state != reg.state and state not in TRANSITIONS[reg.state]:
            allowed = ", ".join(TRANSITIONS[reg.state])
            skipped.append({"id": reg.id, "state": reg.state,
                            "reason": f"{reg.state}: it can become {allowed}"})  # fmt: skip
            continue
        try:
            change.apply(session, reg.id)
        except UsageError as err:
            raise BadRequest(str(err)) from None
        changed.append(reg.id)
    if not changed:
        raise BadRequest(
            f"alert {alert_id}: none of its regressions can become {change.state} ("
            + "; ".join(f"#{s['id']} is {s['reason']}" for s in skipped)
            + ")"
        )
    return triage_result(session, [r.id for r in regressions], skipped)
