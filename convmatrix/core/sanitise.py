"""Making any text a kernel produced safe to send between processes and to store.

A kernel's exception message (or a traceback, a property detail) may hold anything: lone
surrogates (``bytes.decode(errors="surrogateescape")``) that execnet and UTF-8 drivers cannot
encode, NUL bytes PostgreSQL refuses in text columns, megabytes of text. Every such string is
passed through ``clean_text`` once, where a result is built (``CaseResult.sanitised``) and again,
idempotently, where it is serialised, so nothing downstream has to care.

Where such text leaves the program it is made safe for its reader: ``xml_safe`` for JUnit XML
(XML 1.0 cannot hold most control characters), ``terminal_safe`` for a terminal or a CI log
(an ANSI escape sequence can clear the screen, set the window title or overwrite a line with
a carriage return, so a log could be spoofed); HTML is escaped by its templates.
``safe_str`` is ``str()`` of anything a kernel hands back, even an exception whose ``__str__``
raises.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TEXT", "clean_text", "redact_argv", "safe_str", "terminal_safe", "xml_safe"]

MAX_TEXT = 4096  # characters kept of one message; the rest is counted, not kept


def _escape(ch: str) -> str:
    code = ord(ch)
    if code == 0:
        return "\\x00"
    return f"\\u{code:04x}"  # a lone surrogate


def _surrogate_free(text: str) -> bool:
    """No lone surrogate in ``text``: exactly what strict UTF-8 refuses to encode. Checked in
    C (a Python test per character cost the writer more than its SQL on long details)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_text(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` with lone surrogates and NUL written as backslash escapes and anything past
    ``limit`` characters replaced by ``... [N more chars]``; None stays None. Idempotent."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = str(text)
    if "\x00" in text or not _surrogate_free(text):
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


# Characters a terminal acts on rather than shows: C0 controls but newline and tab, DEL, the
# C1 controls (0x80-0x9f: CSI 0x9b starts an escape sequence on its own), and the Unicode
# format characters that reorder or hide text (bidirectional overrides and isolates, zero
# width joiners): "Trojan source" reads differently than it runs.
_BIDI = {0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0xFEFF}
_BIDI.update(range(0x202A, 0x202F))
_BIDI.update(range(0x2066, 0x206A))


def _terminal_char(code: int) -> bool:
    """Whether a terminal shows the character as itself."""
    if code < 0x20:
        return code in (0x9, 0xA)
    if 0x7F <= code <= 0x9F:
        return False
    return code not in _BIDI and not 0xD800 <= code <= 0xDFFF


def terminal_safe(text: str | None) -> str:
    """``text`` with every character a terminal would act on written as a visible backslash
    escape (ESC as ``\\x1b``, a carriage return as ``\\r``, a bidirectional override as
    ``\\u202e``): newline and tab stay. Use it wherever kernel text reaches a terminal (the
    run's worst failures, pytest's reports and warnings, ``regressions show``)."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = safe_str(text)
    if all(_terminal_char(ord(c)) for c in text):
        return text
    out = []
    for c in text:
        code = ord(c)
        if _terminal_char(code):
            out.append(c)
        elif c == "\r":
            out.append("\\r")
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


def safe_str(value: object) -> str:
    """``str(value)``, or a description of it when its ``__str__`` raises (a kernel's
    exception may: that is the kernel's failure, not the harness's)."""
    try:
        return str(value)
    except Exception as err:
        return f"<{type(value).__name__} whose str() raised {type(err).__name__}>"


# A URL's password: in its user part (``user:p@ss@host``: up to the last ``@``) or a query
# parameter whose name holds "password".
_USERINFO = re.compile(r"(://[^:/@\s]*:)[^/?#]*@")
_PASSWORD_PARAM = re.compile(r"([?&][^=&\s]*password[^=&\s]*=)[^&#]*", re.IGNORECASE)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the password of every URL in it redacted (``--db URL``,
    ``--db=URL``, ``CONVMATRIX_DB=URL``), as ``db.engine.redact_url`` shows one: a run's stored argv
    must hold no secret. Arguments without a URL stay as they are."""
    shown = []
    for arg in argv:
        if "://" in arg:
            arg = _USERINFO.sub(r"\1***@", arg)
            arg = _PASSWORD_PARAM.sub(r"\1***", arg)
        shown.append(arg)
    return shown
