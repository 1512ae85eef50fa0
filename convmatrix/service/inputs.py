"""What ``convmatrix serve`` refuses before it looks anything up: input no query can hold.

A path parameter or query value with a NUL (PostgreSQL refuses it in text) or other control
character, or longer than any name the database holds, is malformed: 400 with one line, where
a well-formed name that matches nothing stays 404 (``service.app``) and nothing is a 500.
"""

from __future__ import annotations

from collections.abc import Iterable

from convmatrix.core.errors import InputError

__all__ = ["MAX_PARAM", "check_params"]

MAX_PARAM = 1000  # characters of one parameter: a label is at most 200, a date about 30


def check_params(params: Iterable[tuple[str, str]]) -> None:
    """``InputError`` naming the first parameter that no query can hold."""
    for name, value in params:
        if len(value) > MAX_PARAM:
            raise InputError(f"{name}: {len(value)} characters (at most {MAX_PARAM})")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise InputError(f"{name}: a control character in the value")
