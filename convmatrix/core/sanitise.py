"""Making any text a kernel produced safe to send between processes and to store.

A kernel's exception message (or a traceback, a property detail) may hold anything: lone
surrogates (``bytes.decode(errors="surrogateescape")``) that execnet and UTF-8 drivers cannot
encode, NUL bytes PostgreSQL refuses in text columns, megabytes of text. Every such string is
passed through ``clean_text`` once, where a result is built (``CaseResult.sanitised``) and again,
idempotently, where it is serialised, so nothing downstream has to care.
"""

from __future__ import annotations

__all__ = ["MAX_TEXT", "clean_text"]

MAX_TEXT = 4096  # characters kept of one message; the rest is counted, not kept


def _escape(ch: str) -> str:
    code = ord(ch)
    if code == 0:
        return "\\x00"
    return f"\\u{code:04x}"  # a lone surrogate


def clean_text(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` with lone surrogates and NUL written as backslash escapes and anything past
    ``limit`` characters replaced by ``... [N more chars]``; None stays None. Idempotent."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = str(text)
    if "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        text = "".join(_escape(c) if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    if len(text) > limit:
        marker = f"... [{len(text) - limit} more chars]"
        text = text[:limit] + marker
    return text
