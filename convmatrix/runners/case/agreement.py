"""Two outputs of one kernel that must agree: exactly, or within the main reference's bounds.

A property check (``runners.case.properties``) calls the kernel again and compares what comes back
with the case's own outputs. Where the comparison keeps a tolerance it is the bound model's
(docs/spec.md §4), and the bound is the one the case's verdict already computes: the check
hands an ``Agreement`` to the metrics loop (``runners.case.execute``), which shows it each channel
block of the reference as it streams past, so no second float64 reference is computed and no
whole-tensor bound is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from convmatrix.core.records import PropertyResult
from convmatrix.runners.case.bounds import bound_usage
from convmatrix.runners.case.guards import same_bits
from convmatrix.runners.case.inputs import ForwardInputs
from convmatrix.runners.case.metrics import unravel

__all__ = [
    "Agreement",
    "Calls",
    "Changed",
    "MainCall",
    "PendingAgreement",
    "identical",
    "largest_diff",
]

F64 = torch.float64

# Picks the compared elements (e.g. time steps) from a tensor shaped like the output.
Select = Callable[[torch.Tensor], torch.Tensor]


def largest_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, list[int]]:
    """(largest |a - b|, where): NaN where the other is not counts as infinite."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    diff = (a64 - b64).abs()
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    diff = torch.where(both_nan, 0.0, torch.nan_to_num(diff, nan=float("inf")))
    flat = int(torch.argmax(diff))
    where = unravel(flat, diff.shape)
    return float(diff.reshape(-1)[flat]), where


def identical(label: str, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None when ``a`` and ``b`` hold the same values (NaN where NaN), else the largest
    difference and where it is."""
    if a.numel() == 0 or (a.dtype == b.dtype and torch.equal(a, b)):  # one pass, usually
        return None
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if bool(same.all()):
        return None
    diff, where = largest_diff(a, b)
    count = int((~same).sum())
    return (
        f"{label}: y differs in {count} element(s) (must be identical), "
        f"max|diff| {diff:.3g} at {where}"
    )


@dataclass
class Agreement:
    """``got`` (a property call's output) against ``main`` (the case's own output of the same
    name and shape): ``|got - main| <= allowed x bound`` element by element, ``bound`` the
    main reference's (each side may be ``safety`` bounds from it, so ``allowed`` is twice
    that), plus ``slack x mag`` where the property's calls round once more than the main
    call (chunks: each chunk's partial result and the carried state's gradient).

    ``select`` picks the compared elements from a block of either tensor and of the bound
    (None: all of them); ``span`` says which time steps of ``main`` (and of the bound) ``got``
    holds (None: all): a chunk's output is judged where it lies, with no joined copy of the
    chunks. ``add`` sees one channel block at a time; ``problem`` is the verdict.
    Only the elements that differ are divided by their bound (an equal pair is 0 bounds
    apart whatever its bound): a chunked dx differs near the split alone.
    """

    label: str
    output: str
    got: torch.Tensor
    main: torch.Tensor
    allowed: float
    slack: float = 0.0
    select: Select | None = None
    span: tuple[int, int] | None = None
    usage: float = 0.0
    worst: tuple[float, list[int]] | None = None  # largest |diff| and where, once over
    judged: bool = False  # shown at least one block (an agreement never shown is a harness bug)
    same: bool | None = None  # got and main equal bit for bit: every block agrees (found once)

    def add(
        self, block: slice | None, dim: int, bound: torch.Tensor, mag: torch.Tensor | None
    ) -> None:
        """Judge channels ``block`` (all for None; ``dim`` their dimension) under ``bound``,
        the main verdict's bound of those channels, and ``mag`` their magnitudes where the
        stored form keeps them (``refcache.footprint.SLACK_OUTPUTS``; float64, on the
        reference's device)."""
        self.judged = True
        if self.same is None:  # often so (y and dx of chunks): then no block needs a bound
            got, main = self.got.detach(), self._time(self.main.detach())
            if self.select is not None:
                got, main = self.select(got), self.select(main)
            self.same = same_bits(got, main)
        if self.same:
            return
        got, main = _channels(self.got, block, dim), self._time(_channels(self.main, block, dim))
        bound = self._time(bound)
        extra = self._time(mag) if self.slack and mag is not None else None
        if self.select is not None:
            got, main, bound = self.select(got), self.select(main), self.select(bound)
            extra = None if extra is None else self.select(extra)
        # NaN too: a NaN is infinitely many bounds from anything
        where_ = torch.nonzero(got != main, as_tuple=True)
        if where_[0].numel() == 0:
            return
        on = tuple(i.to(bound.device) for i in where_)
        allowed = bound[on] if extra is None else bound[on] + self.slack * extra[on]
        usage = bound_usage(got[where_], main[where_].to(bound.device, F64), allowed)
        if usage > self.usage:
            self.usage = usage
        if usage > self.allowed:
            diff, where = largest_diff(got, main)
            if self.worst is None or diff > self.worst[0]:
                if block is not None:  # a select keeps the channel dimension
                    where[dim] += block.start
                if self.span is not None:
                    where[-1] += self.span[0]
                self.worst = diff, where

    def _time(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s time steps that ``got`` holds."""
        return t if self.span is None else t[..., self.span[0] : self.span[1]]

    def problem(self) -> str | None:
        """None when every block agreed, else the usage and the largest difference."""
        if self.usage <= self.allowed:
            return None
        diff, where = self.worst or (float("nan"), [])
        return (
            f"{self.label}: {self.output} differs by {self.usage:.3g} bounds "
            f"(allowed {self.allowed:.3g}), max|diff| {diff:.3g} at {where}"
        )


def _channels(t: torch.Tensor, block: slice | None, dim: int) -> torch.Tensor:
    if block is None:
        return t.detach()
    return t.detach().narrow(dim, block.start, block.stop - block.start)


@dataclass
class Calls:
    """Kernel calls a property check made: forwards, and backwards (one per differentiated
    forward: a chunked backward calls the kernel's backward once per chunk)."""

    forward: int = 0
    backward: int = 0


@dataclass
class MainCall:
    """The case's own call that every property check compares with: its inputs (still
    guarded), its outputs by name, and the calls counter the running check adds to."""

    inputs: ForwardInputs
    outputs: dict[str, torch.Tensor]
    calls: Calls = field(default_factory=Calls)
    # the changed forwards by their changed time steps, for the checks that share one
    changed: dict[tuple[tuple[int, int], ...], Changed] = field(default_factory=dict)


@dataclass
class Changed:
    """A changed forward's y, and the time spans of it already found identical to the main
    y (a check sharing the call compares only what another has not)."""

    y: torch.Tensor
    same: list[tuple[int, int]] = field(default_factory=list)

    def unseen(self, spans: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
        return [(a, b) for a, b in spans if not any(c <= a and b <= d for c, d in self.same)]


@dataclass
class PendingAgreement:
    """A check whose kernel calls are made: its exact comparisons judged already
    (``problems``), its bounded ones waiting for the main reference (``agreements``), or its
    result decided (``result``: not applicable, or the kernel raised)."""

    calls: Calls
    ok: str = ""  # the detail of a check that passes
    agreements: list[Agreement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    result: PropertyResult | None = None
    guard_damage: str | None = None  # what the check's own calls broke

    def finish(self, name: str) -> PropertyResult:
        """The check's result once every block of the main reference has been shown."""
        result = self.result
        if result is None:
            unjudged = [a.output for a in self.agreements if not a.judged]
            if unjudged:  # the metrics loop never showed these outputs: never a silent pass
                raise RuntimeError(f"{name}: {', '.join(unjudged)} never judged (no bound)")
            problems = [*self.problems, *(p for a in self.agreements if (p := a.problem()))]
            result = PropertyResult(name, not problems, "; ".join(problems) or self.ok)
        if self.guard_damage:
            detail = f"{self.guard_damage}; {result.detail}" if result.detail else self.guard_damage
            result = PropertyResult(name, False, detail)
        result.forward_calls, result.backward_calls = self.calls.forward, self.calls.backward
        return result
