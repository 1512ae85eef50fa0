"""Greedy delta debugging: a failing case walked down to the simplest case that fails the
same way, each candidate a real case judged by a ``Probe`` (the run's kernel, device and
verdict).

A failure found at L=8192, C=1536, B=2 says nothing of its trigger; its shrunk case does
("passes at C=1024, fails at C=1025", one token, one row, no bias). The walk, in passes until
one changes nothing or the budget of case runs is spent:

1. sizes down (seqlen, dim, batch; for updates tokens, steps, state length): first the
   smallest legal value; when it passes, the kernel's boundaries of the dimension
   (``tile-1, tile, tile+1``, ``vec±1``, ``ctile±1``: small, so cheap runs), then halving
   while the case still fails; then the boundary between the last passing and the first
   failing value, trying first one past a passing value that sits on the kernel's geometry
   (a multiple of its time tile, channel tile or vector width, or a power of two:
   ``tile+1``, ``1024+1``), else the most aligned value between the two (binary search that
   lands on tile and power-of-two boundaries);
2. features off, one at a time, kept off when the failure stays: bias, activation, initial
   and final state (and dF), packing, gaps, the gradient's layout, the ring buffer and slot
   mapping of updates, then the simpler layout (channel-first) and the dtypes (to float32
   only where the failure stays). The op stays: the shrunk case is an ``include:`` entry of
   the original's suite.

"The failure stays" means the candidate fails the same way as the original
(``ProbeOutcome.same_failure``: same outcome and exception, a failing output in common), so
a shrink never slides from one bug to another. Candidates outside the kernel's contract are
not run (they would be expected-error cases, a different question).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from convmatrix.core.case import Case
from convmatrix.matrix.build import applicable_checks
from convmatrix.search.probe import Probe, ProbeOutcome
from convmatrix.search.space import case_entry
from convmatrix.search.stop import BudgetSpent

__all__ = ["LABELS", "ShrinkResult", "Step", "shrink"]

# How a dimension is written in boundaries ("passes at C=1024, fails at C=1025").
LABELS = {"seqlen": "L", "dim": "C", "batch": "B", "tokens": "T", "state_len": "S"}
_SIZES = {
    "fwd": ("seqlen", "dim", "batch"),
    "fwd_bwd": ("seqlen", "dim", "batch"),
    "update": ("tokens", "steps", "state_len", "dim", "batch"),
}
_UNITS = {"seqlen": ("tile",), "tokens": ("tile",), "dim": ("vec", "ctile")}
# Features in the order they are turned off: (name, the Case fields the simpler value sets).
_FEATURES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("bias", {"bias": False}),
    ("activation", {"activation": None}),
    ("initial_state", {"initial_state": "none"}),
    ("final_state", {"final_state": False}),
    ("dfinal", {"dfinal": "zero"}),
    ("packing", {"seq_lens": None}),
    ("gap", {"gap": None}),
    ("grad_layout", {"grad_layout": None}),
    ("circular", {"circular": False}),
    ("slots", {"slots": None}),
    ("layout", {"layout": "channel_first"}),
    ("dtype", {"x_dtype": "float32", "w_dtype": "float32"}),
)


@dataclass(frozen=True)
class Step:
    """One candidate judged: ``dimension`` changed ``before`` → ``after``; ``failed``: it
    failed the same way (and was kept)."""

    dimension: str
    before: Any
    after: Any
    failed: bool
    outcome: str

    def to_json(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "from": self.before, "to": self.after,
                "failed": self.failed, "outcome": self.outcome}  # fmt: skip

    def line(self) -> str:
        verdict = "fails, kept" if self.failed else f"{self.outcome}, dropped"
        return f"{self.dimension}: {self.before} -> {self.after}  {verdict}"


@dataclass
class ShrinkResult:
    """The simplest failing case found, how it was reached and where each dimension's
    boundary lies: ``boundaries[dim] = (passing, failing)`` values (a feature that could
    not be turned off: its simpler value passes, the case's value fails)."""

    case: Case
    original: Case
    failure: ProbeOutcome  # the original's (what every kept candidate matched)
    runs: int  # case runs, the original's reproduction included
    path: list[Step] = field(default_factory=list)
    boundaries: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    exhausted: bool = False  # its runs (or explore's time) were spent: the walk may not be done
    outcome: ProbeOutcome | None = None  # the shrunk case's own (its CaseResult within)
    interrupted: bool = False  # a signal ended the walk: ``case`` is the smallest so far

    def dimensions(self) -> dict[str, Any]:
        """The shrunk case, dimension by dimension (as a matrix include entry spells it)."""
        op, entry = case_entry(self.case)
        return {"op": op, **entry}

    def boundary_lines(self) -> list[str]:
        lines = []
        for name, (passing, failing) in self.boundaries.items():
            label = LABELS.get(name, name)
            lines.append(f"passes at {label}={passing}, fails at {label}={failing}")
        return lines

    def include_snippet(self) -> str:
        """The shrunk case as an ``include:`` entry of a suite named ``case.suite`` with
        ``op: case.op`` (every dimension explicit, so it expands to this very case)."""
        _, entry = case_entry(self.case)
        body = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6)
        notes = [f"# {self.case.pytest_id}: {self.failure.signature} (convmatrix shrink, "
                 f"{self.runs} case runs, from {self.original.pytest_id})"]  # fmt: skip
        notes += [f"# {line}" for line in self.boundary_lines()]
        where = f"# in suite {self.case.suite} (op {self.case.op}):"
        return "\n".join([*notes, where, "include:", f"  - {body.strip()}"]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.dimensions(),
            "case_id": self.case.id,
            "from_case": self.original.id,
            "signature": self.failure.signature,
            "runs": self.runs,
            "path": [s.to_json() for s in self.path],
            "boundaries": {k: list(v) for k, v in self.boundaries.items()},
            "exhausted": self.exhausted,
            "interrupted": self.interrupted,
        }


def variant(case: Case, **changes: Any) -> Case:
    """``case`` with ``changes``, made whole: a new id, fields that no longer apply cleared
    (dF without a backward final state, a gradient layout without a backward), packing
    scaled to a shorter seqlen, and only the property checks that still mean something."""
    fields = {**changes}
    op = fields.get("op", case.op)
    final = fields.get("final_state", case.final_state)
    if op != "fwd_bwd":
        fields |= {"dfinal": None, "grad_layout": None}
    elif not final:
        fields["dfinal"] = None
    seq_lens = fields.get("seq_lens", case.seq_lens)
    if "seqlen" in fields and seq_lens is not None:
        fields["seq_lens"] = _trimmed(seq_lens, fields["seqlen"])
    new = dataclasses.replace(case, id="", **fields)
    return dataclasses.replace(new, checks=applicable_checks(new, case.checks), id="")


def _trimmed(seq_lens: tuple[int, ...], seqlen: int) -> tuple[int, ...]:
    """The packing scaled to ``seqlen`` tokens: every segment kept (padding as padding), each
    in proportion and at least one token, so a bug at a sequence boundary stays reachable;
    when there are more segments than tokens, the first ``seqlen`` tokens' segments."""
    total = sum(abs(n) for n in seq_lens)
    if seqlen < len(seq_lens) or total <= 0:
        out, left = [], seqlen
        for n in seq_lens:
            if left <= 0:
                break
            size = min(abs(n), left)
            out.append(size if n > 0 else -size)
            left -= size
        return tuple(out)
    sizes = [max(1, abs(n) * seqlen // total) for n in seq_lens]
    i = 0
    while sum(sizes) != seqlen:  # rounding: give or take a token, largest segments first
        order = sorted(range(len(sizes)), key=lambda k: -sizes[k])
        k = order[i % len(order)]
        if sum(sizes) < seqlen:
            sizes[k] += 1
        elif sizes[k] > 1:
            sizes[k] -= 1
        i += 1
    return tuple(size if n > 0 else -size for size, n in zip(sizes, seq_lens, strict=True))


class _Walk:
    """One shrink: the current case, the budget, what was tried."""

    def __init__(self, case: Case, probe: Probe, max_runs: int, same_failure: bool) -> None:
        self.probe, self.max_runs, self.same = probe, max_runs, same_failure
        self.start = probe.runs
        self.original = case
        self.case = case
        self.failure = probe.judge(case)
        self.kept = self.failure
        self.path: list[Step] = []
        self.boundaries: dict[str, tuple[Any, Any]] = {}
        self.seen: dict[str, bool] = {case.id: self.failure.failed}
        self.units = probe.geometry

    @property
    def runs(self) -> int:
        return self.probe.runs - self.start

    @property
    def spent(self) -> bool:
        return self.runs >= self.max_runs

    def fails(self, candidate: Case, dimension: str, before: Any, after: Any) -> bool | None:
        """Whether ``candidate`` fails as the original does (kept as the current case);
        None when it was not run (the budget is spent, or the kernel's contract refuses it)."""
        if candidate.id in self.seen:
            return self.seen[candidate.id]
        if self.spent or self.probe.violation(candidate) is not None:
            return None
        got = self.probe.judge(candidate)
        kept = got.failed and (not self.same or got.same_failure(self.failure))
        self.seen[candidate.id] = kept
        self.path.append(Step(dimension, before, after, kept, got.outcome))
        if kept:
            self.case, self.kept = candidate, got
        return kept

    # -- sizes ------------------------------------------------------------------------------
    def minimum(self, name: str) -> int:
        return self.case.width - 1 if name == "state_len" else 1

    def try_size(self, name: str, value: int) -> bool | None:
        current = getattr(self.case, name)
        return self.fails(variant(self.case, **{name: value}), name, current, value)

    def aligned(self, name: str, value: int) -> bool:
        units = [self.units[u] for u in _UNITS.get(name, ()) if u in self.units]
        power = value >= 2 and value & (value - 1) == 0
        return power or any(value % u == 0 for u in units if u > 1)

    def geometry_points(self, name: str, low: int, high: int) -> list[int]:
        """The kernel's boundaries of this dimension strictly between ``low`` and ``high``,
        ascending: ``tile-1, tile, tile+1`` (seqlen, tokens), ``vec±1`` and ``ctile±1``
        (dim). Small cases, so cheap runs; a bug of the geometry fails at one of them even
        where failing is not monotonic in the size (``L mod tile``)."""
        units = [self.units[u] for u in _UNITS.get(name, ()) if u in self.units]
        points = {p for u in units if u > 1 for p in (u - 1, u, u + 1)}
        return sorted(p for p in points if low < p < high)

    def shrink_size(self, name: str) -> None:
        value = getattr(self.case, name)
        low = self.minimum(name)
        if value is None or value <= low:
            return
        known = self.boundaries.get(name)
        holds = known is not None and known[1] == value and known[0] >= low
        if holds and self.try_size(name, known[0]) is False:  # the boundary still holds
            return
        if self.try_size(name, low):
            self.boundaries.pop(name, None)
            return
        passing = low  # judged: the smallest value passed
        for point in self.geometry_points(name, low, value):
            got = self.try_size(name, point)
            if got:
                break
            if got is False:
                passing = point
        while not self.spent:
            half = getattr(self.case, name) // 2
            if half <= passing:
                break
            got = self.try_size(name, half)
            if not got:
                passing = half if got is False else passing
                break
        self.bisect(name, passing)

    def bisect(self, name: str, passing: int) -> None:
        """Between ``passing`` and the current (failing) value: one past an aligned passing
        value first, else the most aligned value between them."""
        while not self.spent:
            failing = getattr(self.case, name)
            if failing - passing <= 1:
                break
            point = passing + 1
            if (
                not self.aligned(name, passing)
                or variant(self.case, **{name: point}).id in self.seen
            ):
                point = _most_aligned(passing, failing)
            got = self.try_size(name, point)
            if got is None:
                break
            if not got:
                passing = point
        failing = getattr(self.case, name)
        if failing - passing == 1:
            self.boundaries[name] = (passing, failing)

    # -- features ---------------------------------------------------------------------------
    def shrink_feature(self, name: str, changes: dict[str, Any]) -> None:
        current = {k: getattr(self.case, k) for k in changes}
        if all(_same(current[k], v) for k, v in changes.items()):
            return
        if name == "dfinal" and not self.case.final_state:
            return
        before = _shown(current)
        after = _shown(changes)
        got = self.fails(variant(self.case, **changes), name, before, after)
        if got is False:
            self.boundaries[name] = (after, before)
        elif got:
            self.boundaries.pop(name, None)

    def passes(self) -> Iterator[Callable[[], None]]:
        for name in _SIZES[self.case.op]:
            yield lambda name=name: self.shrink_size(name)
        for name, changes in _FEATURES:
            yield lambda name=name, changes=changes: self.shrink_feature(name, changes)


def _same(a: Any, b: Any) -> bool:
    """Whether a field's value already is the simpler one (``None`` and ``"none"`` alike)."""
    none = (None, "none", False)
    return a == b or (a in none and b in none)


def _shown(values: dict[str, Any]) -> Any:
    items = list(values.values())
    return items[0] if len(items) == 1 else "/".join(str(v) for v in items)


def _most_aligned(low: int, high: int) -> int:
    """The value strictly between ``low`` and ``high`` divisible by the largest power of two
    (the smallest such): binary search that lands on tile and power-of-two boundaries."""
    for bits in range(high.bit_length(), -1, -1):
        step = 1 << bits
        value = (low // step + 1) * step
        if value < high:
            return value
    return (low + high) // 2


def shrink(
    case: Case, probe: Probe, *, max_runs: int = 60, same_failure: bool = True
) -> ShrinkResult:
    """Shrink failing ``case`` on ``probe``'s kernel within ``max_runs`` case runs (the
    original's reproduction is the first). ``same_failure=False`` keeps any failing
    candidate, whatever failed. A case that does not fail on the probe is returned as is
    (``runs`` 1, no path). A signal (``KeyboardInterrupt``) after the reproduction ends the
    walk with the smallest case that failed the same way so far (``interrupted``), and so
    does the end of explore's budget (``BudgetSpent``: ``exhausted``); either during the
    reproduction leaves: nothing was found to keep."""
    if max_runs < 1:
        raise ValueError(f"max_runs {max_runs}: at least 1 (the original's reproduction)")
    walk = _Walk(case, probe, max_runs, same_failure)
    interrupted = out_of_time = False
    try:
        _walk_down(walk)
    except BudgetSpent:  # explore's budget: the walk ends as if its runs were spent
        out_of_time = True
    except KeyboardInterrupt:
        interrupted = True
    return ShrinkResult(
        case=walk.case,
        original=case,
        failure=walk.failure,
        runs=walk.runs,
        path=walk.path,
        boundaries=walk.boundaries,
        exhausted=walk.spent or out_of_time,
        outcome=walk.kept,
        interrupted=interrupted,
    )


def _walk_down(walk: _Walk) -> None:
    """The passes, until one changes nothing or the budget is spent."""
    changed = walk.failure.failed
    while changed and not walk.spent:
        before = walk.case.id
        for step in walk.passes():
            if walk.spent:
                break
            step()
        changed = walk.case.id != before
