"""Which property checks may run for a kernel: every call a check makes, described as a Case
and put to the kernel's declared contract before the check runs.

A property check calls the kernel with arguments the case itself does not ask for (chunk
consistency asks for the final state of two chunks of the row and passes the first one's to
the second; causality and packed isolation repeat the main call's forward). A check must
never call a kernel outside what it declares (a kernel that rejects ``seq_idx`` with a final
state would otherwise fail every packed case), so each call is first checked with
``core.contract.refusal``; a check with a refused call is recorded as not applicable, with
the reason, and counts as passed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import refusal
from convmatrix.core.records import PropertyResult
from convmatrix.runners.case.inputs import seq_idx_for

__all__ = ["NOT_APPLICABLE", "calls_of", "not_applicable", "refused_call", "split_point"]

NOT_APPLICABLE = "not applicable: "


def not_applicable(name: str, reason: str) -> PropertyResult:
    """A check that could not run: passed, its detail ``not applicable: <reason>``."""
    return PropertyResult(name, True, NOT_APPLICABLE + reason)


def split_point(case: Case, ids: torch.Tensor | None, length: int) -> int | None:
    """A split s in [1, L) where tokens max(0, s-K+1)..s share one live sequence (the carried
    state then belongs to chunk 2's first sequence, as in the whole call); nearest L/2."""
    for s in sorted(range(1, length), key=lambda s: abs(s - length // 2)):
        if ids is None:
            return s
        window = ids[max(0, s - case.width + 1) : s + 1]
        if bool((window == window[0]).all()) and int(window[0]) >= 0:
            return s
    return None


def _split_lens(
    seq_lens: tuple[int, ...] | None, s: int
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """The packing of tokens [0, s) and [s, L) (a segment cut at s is in both)."""
    if seq_lens is None:
        return None, None
    first: list[int] = []
    second: list[int] = []
    pos = 0
    for n in seq_lens:
        size, sign = abs(n), (-1 if n < 0 else 1)
        head = min(max(s - pos, 0), size)
        first += [sign * head] if head else []
        second += [sign * (size - head)] if size - head else []
        pos += size
    return tuple(first), tuple(second)


def _forward_only(case: Case) -> list[Case]:
    """causality / packed isolation: the main call's forward again (its final state too, as
    the case asks), on changed x, without a gradient."""
    return [dataclasses.replace(case, op="fwd", dfinal=None)]


def _chunks(case: Case) -> list[Case]:
    """chunk consistency: the row's two chunks, each with a state in and asked for its final
    state (backward too for ``fwd_bwd``): the first with the case's initial state (zeros when
    it has none), the second with the first's final state; [] when there is no split inside
    a sample (the whole row is the main call itself)."""
    state = case.initial_state if case.initial_state not in (None, "none") else "zeros"
    dfinal = (case.dfinal or "zero") if case.op == "fwd_bwd" else None
    length = case.seqlen or 0
    ids = None if case.seq_lens is None else seq_idx_for(case.seq_lens, 1)[0]
    s = split_point(case, ids, length)
    if s is None:
        return []
    first, second = _split_lens(case.seq_lens, s)
    chunk = dataclasses.replace(case, initial_state=state, final_state=True, dfinal=dfinal)
    return [
        dataclasses.replace(chunk, seqlen=s, seq_lens=first),
        dataclasses.replace(chunk, seqlen=length - s, seq_lens=second, initial_state="random"),
    ]


_CALLS: dict[str, Callable[[Case], list[Case]]] = {
    "causality": _forward_only,
    "packed_isolation": _forward_only,
    "chunk_consistency": _chunks,
}


def calls_of(name: str, case: Case) -> list[Case]:
    """The calls property ``name`` makes for ``case``, each described as a Case."""
    return _CALLS[name](case)


def refused_call(kernel: Any, name: str, case: Case) -> str | None:
    """Why property ``name`` cannot run for ``case`` on ``kernel`` (the first call its
    declared contract refuses), or None."""
    for call in calls_of(name, case):
        reason = refusal(kernel, call)
        if reason:
            what = "" if call.seqlen == case.seqlen else f" (chunk of {call.seqlen} tokens)"
            return f"{reason}{what}"
    return None
