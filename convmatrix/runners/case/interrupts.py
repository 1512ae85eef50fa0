"""Telling a real interrupt from a kernel that raises ``KeyboardInterrupt`` (or any other
``BaseException``).

A kernel may raise ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` or its own
``BaseException`` subclass; none of them is a reason to stop the run: the case is ``crashed``
with the exception's type and text and the run goes on. A person's Ctrl-C (SIGINT) or a
SIGTERM must still stop the run, so the handlers installed here note the signal before
raising ``KeyboardInterrupt``; ``is_real_interrupt`` asks whether one arrived.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from convmatrix.core.sanitise import safe_str

__all__ = [
    "install_signal_handlers",
    "interrupt_taken",
    "is_real_interrupt",
    "kernel_crash_message",
    "note_signal",
    "note_taken",
]

_received: list[int] = []  # signals received by this process (SIGINT, SIGTERM)
_taken = [0]  # how many of them a pytest session had caught when it last caught one


def note_signal(signum: int) -> None:
    """Record that ``signum`` arrived (the handlers call this before raising)."""
    _received.append(signum)


def note_taken() -> None:
    """A pytest session caught the interrupt (``pytest_keyboard_interrupt``): it ends and
    closes its run now, and raising the stop again would cut that close short (the run left
    ``running``): ``search.stop`` stops insisting once this is noted."""
    _taken[0] = len(_received)


def interrupt_taken() -> bool:
    """Whether a session caught the interrupt since the last signal arrived."""
    return _taken[0] >= len(_received) > 0


def _sigint(signum: int, frame: Any) -> None:
    note_signal(signum)
    raise KeyboardInterrupt


def install_signal_handlers() -> None:
    """Route SIGINT through ``note_signal`` (main thread only; others leave it alone). A
    handler someone else installed is kept."""
    with contextlib.suppress(ValueError):
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _sigint)


def is_real_interrupt(exc: BaseException) -> bool:
    """True for a ``KeyboardInterrupt`` that a signal caused (stop the run), False for any
    ``BaseException`` a kernel raised by itself (record the case as crashed)."""
    return isinstance(exc, KeyboardInterrupt) and bool(_received)


def kernel_crash_message(exc: BaseException) -> str:
    """The ``crashed`` message of a case whose kernel raised a ``BaseException``."""
    return (
        f"the kernel raised {type(exc).__name__}: {safe_str(exc)} (a BaseException, not an error: "
        "the case is recorded as crashed and the run goes on)"
    )
