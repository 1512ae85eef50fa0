"""What ``convmatrix serve`` refuses before it looks anything up: input no query can hold.

- A path parameter or query value with a NUL (PostgreSQL refuses it in text) or other control
  character, or longer than any name the database holds, is malformed: 400 with one line.
- An id (``/alerts/{id}``, ``/regressions/{id}``, the write API's) is ASCII digits its
  column holds (``db.queries.MAX_ID``: INTEGER, which PostgreSQL refuses past 2**31 - 1):
  ``²`` or ``١`` (``str.isdigit`` says yes, ``int`` reads some) and a larger number name no
  row, so they are 404 like any id that matches nothing.
- Text a request stores (a note, an assignee, a bug link, who) holds no NUL, no lone
  surrogate (UTF-8 cannot encode one: SQLite and PostgreSQL both refuse it) and, but for
  a note's line breaks and tabs, no control character: 400 naming the field.

A well-formed name that matches nothing stays 404 (``service.app``) and nothing is a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from convmatrix.core.errors import InputError, UsageError
from convmatrix.db.queries import parse_id

__all__ = [
    "ID_PARAMS",
    "MAX_PARAM",
    "check_ids",
    "check_params",
    "check_text",
    "parse_id",
]

MAX_PARAM = 1000  # characters of one parameter: a label is at most 200, a date about 30
ID_PARAMS = ("alert_id", "regression_id", "id")  # path parameters that are row ids
_LINE_BREAKS = "\t\n\r"


def check_ids(params: Mapping[str, str]) -> None:
    """``UsageError`` (404: no such row) for the first id parameter that names no row."""
    for name in ID_PARAMS:
        value = params.get(name)
        if value is not None and parse_id(value) is None:
            what = name.removesuffix("_id") if name != "id" else "id"
            raise UsageError(f"{what} {value[:40]!r}: no such {what} (ids are whole numbers)")


def check_text(name: str, value: str, *, lines: bool = False) -> None:
    """``InputError`` when ``value`` holds what no column stores: a NUL, a lone surrogate, a
    control character (line breaks and tabs allowed with ``lines``)."""
    for c in value:
        code = ord(c)
        if 0xD800 <= code <= 0xDFFF:
            raise InputError(f"{name}: a lone surrogate (U+{code:04X}) in the text")
        if (code < 0x20 or 0x7F <= code < 0xA0) and not (lines and c in _LINE_BREAKS):
            raise InputError(f"{name}: a control character (U+{code:04X}) in the text")


def check_params(params: Iterable[tuple[str, str]]) -> None:
    """``InputError`` naming the first parameter that no query can hold."""
    for name, value in params:
        if len(value) > MAX_PARAM:
            raise InputError(f"{name}: {len(value)} characters (at most {MAX_PARAM})")
        check_text(name, value)
