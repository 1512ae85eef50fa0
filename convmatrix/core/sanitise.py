"""Making any text a kernel produced safe to send between processes and to store.

A kernel's exception message (or a traceback, a property detail) may hold anything: lone
surrogates (``bytes.decode(errors="surrogateescape")``) that execnet and UTF-8 drivers cannot
encode, NUL bytes PostgreSQL refuses in text columns, megabytes of text. Every such string is
passed through ``clean_text`` once, where a result is built (``CaseResult.sanitised``) and again,
idempotently, where it is serialised, so nothing downstream has to care.
"""

from __future__ import annotations

__all__ = ["MAX_TEXT", "clean_text", "xml_safe"]

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


def _xml_char(code: int) -> bool:
    """Whether XML 1.0 allows the character (``Char`` production of the spec)."""
    return (
        code in (0x9, 0xA, 0xD)
        or 0x20 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )


def xml_safe(text: str) -> str:
    """``text`` with every character XML 1.0 cannot hold (an ANSI colour's ESC, other C0
    controls, lone surrogates) written as a backslash escape: a kernel's message in a JUnit
    file must not make the whole file unreadable to CI."""
    if all(_xml_char(ord(c)) for c in text):
        return text
    return "".join(c if _xml_char(ord(c)) else f"\\x{ord(c):02x}" if ord(c) < 0x100
                   else f"\\u{ord(c):04x}" for c in text)  # fmt: skip
