"""The whole space of docs/spec.md, drawn one valid case at a time (``convmatrix explore``).

A fixed matrix asks only what its author thought of; explore draws what nobody listed. Every
dimension of docs/spec.md §3 is drawn: op (fwd, fwd_bwd, update), width, seqlen, dim, batch,
layout, gapped views, dtype pairs, bias, activation, initial/final state and dF, packing with
padding, dy's layout, and the update's tokens, steps, state length, ring buffer and slots.

Sizes: the tensor's elements (``matrix.build.case_elements``) are drawn log-uniformly, a
share of the draws (``small_share``) up to ``small_elements``, where most bugs show and a case
costs milliseconds, the others from there up to ``max_elements``, where the size bugs are
(past 2^24 elements, 1024 channels, 4096 tokens) and a case costs seconds; then split into
batch, channels and length, each log-uniform and snapped, more often than not, to a
boundary near it: a power of two or a multiple of the kernel's declared tile (``tile``,
``ctile``, ``vec``: ``Geometry.symbols``), minus one, at it, or plus one; lengths also to the
width's own edges (1, K-2, K-1, K, K+1).

Validity is the matrix's, never a second definition: each draw is written as an ``include``
entry of a one-suite matrix and expanded for the kernel (``expand_matrix``: the intrinsic
rules, the size limit, docs/spec.md §2, the kernel's contract). Only cases the kernel claims
to support are kept (its widths, dtype pairs, layouts, features, state lengths, tokens per
call); draws outside are drawn again, and draws are pushed to the contract's edges (the
largest tokens per call it takes, its shortest and longest state).

The same seed gives the same cases: one ``random.Random(seed)`` drives every choice, in a
fixed order, and nothing iterates over an unordered set.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from convmatrix.core.case import CHECKS, GAPS, GRAD_LAYOUTS, Case
from convmatrix.core.contract import DeclaredKernel
from convmatrix.matrix.build import case_elements
from convmatrix.matrix.errors import MatrixError
from convmatrix.matrix.expand import expand_matrix
from convmatrix.matrix.schema import parse_matrix
from convmatrix.matrix.source import load_yaml

__all__ = [
    "SUITE_PREFIX",
    "CaseSpace",
    "Drawn",
    "case_entry",
    "draw_cases",
    "expand_entries",
    "matrix_text",
]

SUITE_PREFIX = "explore_"  # suites of generated matrices: explore_fwd, explore_fwd_bwd, ...
_MAX_TRIES = 200  # redraws for one valid case before the space is called empty


@dataclass(frozen=True)
class Drawn:
    """One drawn case: ``entry`` is its matrix ``include`` entry (every dimension explicit),
    ``case`` what the matrix expands it to for the kernel."""

    op: str
    entry: Mapping[str, Any]
    case: Case


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high], its logarithm uniform."""
    if high <= low:
        return low
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


@dataclass
class CaseSpace:
    """The cases ``kernel`` claims to support, up to ``max_elements`` elements per tensor.

    ``small_share`` of the draws stay under ``small_elements`` elements; cases of at most
    ``check_elements`` elements also ask for the property checks (causality, packed
    isolation, chunk consistency), which cost a few more kernel calls each.
    """

    kernel: DeclaredKernel
    max_elements: int
    small_share: float = 0.7
    small_elements: int = 1 << 16
    check_elements: int = 1 << 18
    geometry: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        if self.max_elements < 1:
            raise ValueError(f"max_elements must be >= 1, got {self.max_elements}")
        self.geometry = dict(self.kernel.capabilities.geometry.symbols())

    # -- boundaries -------------------------------------------------------------------------
    def _snap(self, rng: random.Random, value: int, cap: int, steps: Sequence[int]) -> int:
        """``value`` or, mostly, a boundary near it: a power of two or a multiple of one of
        ``steps`` (the kernel's tiles), -1, 0 or +1; within [1, cap]."""
        kind = rng.random()
        if kind < 0.3:
            return value
        delta = rng.choice((-1, 0, 1))
        if kind < 0.65 or not steps:
            exponent = math.log2(max(value, 1))
            base = 1 << (math.floor(exponent) if rng.random() < 0.5 else math.ceil(exponent))
        else:
            step = rng.choice(list(steps))
            base = step * max(1, round(value / step))
        snapped = base + delta
        if 1 <= snapped <= cap:
            return snapped
        return value

    def _steps(self, names: Iterable[str]) -> list[int]:
        return [self.geometry[n] for n in names if self.geometry.get(n, 0) > 1]

    # -- dimensions -------------------------------------------------------------------------
    def _elements(self, rng: random.Random) -> int:
        small = min(self.max_elements, self.small_elements)
        if rng.random() < self.small_share:
            return _log_uniform(rng, 1, small)
        return _log_uniform(rng, small, self.max_elements)

    def _sizes(self, rng: random.Random, width: int, time: bool) -> dict[str, int]:
        """batch, dim and (``time``) seqlen with batch x dim x seqlen <= the drawn total."""
        total = self._elements(rng)
        batch = self._snap(rng, _log_uniform(rng, 1, min(64, total)), min(64, total), ())
        room = max(1, total // batch)
        order = ["dim", "seqlen"] if time else ["dim"]
        rng.shuffle(order)
        sizes: dict[str, int] = {"batch": batch}
        edges = [v for v in (1, width - 2, width - 1, width, width + 1) if v >= 1]
        for i, name in enumerate(order):
            last = i == len(order) - 1
            raw = room if last and rng.random() < 0.5 else _log_uniform(rng, 1, room)
            if name == "seqlen" and rng.random() < 0.1:
                value = min(rng.choice(edges), room)  # the width's own edges: short chunks
            else:
                steps = self._steps(("tile",) if name == "seqlen" else ("ctile", "vec"))
                value = self._snap(rng, raw, room, steps)
            sizes[name] = value
            room = max(1, room // value)
        return sizes

    def _width(self, rng: random.Random, op: str) -> int:
        widths = self.kernel.capabilities.widths_for(op)
        if widths is not None:
            return rng.choice(sorted(widths))
        # spec §3: 2, 3, 4, others where a kernel declares them. Not 1 undeclared: its decode
        # state is empty (S = K-1 = 0), which no matrix asks of a kernel (smoke's comment).
        return rng.choice((2, 3, 4)) if rng.random() < 0.85 else rng.randint(5, 8)

    def _ops(self) -> list[tuple[str, float]]:
        features = self.kernel.capabilities.features
        ops = [("fwd", 0.4)]
        if "backward" in features:
            ops.append(("fwd_bwd", 0.4))
        if "update" in features:
            ops.append(("update", 0.2))
        return ops

    def _common(self, rng: random.Random) -> dict[str, Any]:
        caps = self.kernel.capabilities
        x_dtype, w_dtype = rng.choice(sorted(caps.dtype_pairs))
        return {
            "x_dtype": x_dtype,
            "w_dtype": w_dtype,
            "layout": rng.choice(sorted(caps.layouts)),
            "gap": "none" if rng.random() < 0.6 else rng.choice(GAPS),
            "activation": rng.choice(("none", "silu")),
            "bias": rng.random() < 0.5,
        }

    def _packing(self, rng: random.Random, seqlen: int, width: int, final: bool) -> Any:
        """Segment lengths (negative: padding) summing to ``seqlen``, boundaries near tiles,
        short sequences (< K-1) included; "none" most of the time."""
        if seqlen < 2 or rng.random() < 0.65:
            return "none"
        pad = 0 if rng.random() < 0.6 else min(seqlen - 1, rng.choice((1, width - 1, width, 3)))
        pad = max(pad, 0)
        live = seqlen - pad
        tile = self.geometry.get("tile", 16)
        cuts: set[int] = set()
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if kind < 0.4:
                at = tile * rng.randint(1, max(1, live // tile)) + rng.choice((-1, 0, 1))
            elif kind < 0.7:
                at = rng.randint(1, max(1, live - 1))
            else:  # a short sequence: a boundary a few tokens after another
                at = rng.choice([0, *sorted(cuts)]) + rng.randint(1, max(1, width))
            if 0 < at < live:
                cuts.add(at)
        if final and self.kernel.capabilities.final_state == "per_sequence" and live > width:
            cuts.add(live - (width - 1))  # the contract's edge: a last sequence of K-1 tokens
        bounds = [0, *sorted(cuts), live]
        lengths = [b - a for a, b in itertools.pairwise(bounds) if b > a]
        if pad:
            lengths.append(-pad)
        return lengths if len(lengths) > 1 else "none"

    def _forward(self, rng: random.Random, op: str, width: int) -> dict[str, Any]:
        features = self.kernel.capabilities.features
        entry = {"width": width, **self._sizes(rng, width, time=True), **self._common(rng)}
        initial = "none"
        if "initial_state" in features:
            initial = rng.choices(("none", "zeros", "random"), (0.5, 0.15, 0.35))[0]
        final = "final_state" in features and rng.random() < 0.5
        entry |= {"initial_state": initial, "final_state": final}
        if op == "fwd_bwd":
            entry["dfinal"] = "random" if final and rng.random() < 0.6 else "zero"
        packed = "none"
        if "packed" in features:
            packed = self._packing(rng, entry["seqlen"], width, final)
        entry["packed"] = packed
        if op == "fwd_bwd":  # "none" (dense dy) explicit: the same id as leaving it out
            entry["grad_layout"] = rng.choice(GRAD_LAYOUTS) if rng.random() < 0.3 else "none"
        return entry

    def _update(self, rng: random.Random, width: int) -> dict[str, Any]:
        caps = self.kernel.capabilities
        entry = {"width": width, **self._sizes(rng, width, time=False), **self._common(rng)}
        limit = caps.max_update_tokens
        if limit is not None and rng.random() < 0.3:
            tokens = limit  # the contract's edge
        else:
            tokens = 1 if rng.random() < 0.4 else _log_uniform(rng, 1, limit or 64)
        lens = caps.state_lens
        low, high = lens.min_extra, lens.max_extra
        if high is None:
            extra = rng.choice((low, low, low + 1, _log_uniform(rng, max(low, 1), low + 64)))
        else:
            extra = rng.choice((low, high, rng.randint(low, high)))
        slots = "none"
        if "slot_indices" in caps.features and rng.random() < 0.5:
            slots = rng.choice(("identity", "permuted", "permuted_pad"))
            if slots == "permuted_pad" and entry["batch"] < 2:
                slots = "permuted"
        entry |= {
            "tokens": tokens,
            "steps": rng.choice((1, 1, 2, 3, rng.randint(2, 8))),
            "state_len": width - 1 + extra,
            "circular": "ring_buffer" in caps.features and rng.random() < 0.5,
            "slots": slots,
        }
        return entry

    # -- drawing ----------------------------------------------------------------------------
    def _candidate(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        ops = self._ops()
        op = rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        width = self._width(rng, op)
        entry = self._update(rng, width) if op == "update" else self._forward(rng, op, width)
        return op, entry

    def draw(self, rng: random.Random) -> Drawn:
        """One valid case the kernel claims to support (``_MAX_TRIES`` redraws at most)."""
        last = "no draw"
        for _ in range(_MAX_TRIES):
            op, entry = self._candidate(rng)
            try:
                (case,) = expand_entries([(op, entry)], self.kernel)
            except MatrixError as exc:
                last = exc.message
                continue
            if case_elements(case) > self.max_elements:
                last = f"{case_elements(case)} elements over {self.max_elements}"
                continue
            if case.expect != "ok" or self.kernel.capabilities.missing_features(case):
                last = case.expect_reason or "a feature the kernel lacks"
                continue
            if case_elements(case) <= self.check_elements:
                entry = {**entry, "checks": list(CHECKS)}
                (case,) = expand_entries([(op, entry)], self.kernel)
            return Drawn(op, entry, case)
        raise ValueError(f"no valid case in {_MAX_TRIES} draws (the last: {last})")

    def cases(self, seed: int) -> Iterator[Drawn]:
        """Cases drawn from ``seed``, endless: the same seed, the same sequence."""
        rng = random.Random(seed)
        while True:
            yield self.draw(rng)


def draw_cases(kernel: DeclaredKernel, seed: int, count: int, max_elements: int) -> list[Drawn]:
    """The first ``count`` cases of ``seed`` for ``kernel``."""
    stream = CaseSpace(kernel, max_elements).cases(seed)
    return [next(stream) for _ in range(count)]


# -- matrices of explicit cases -------------------------------------------------------------
def case_entry(case: Case) -> tuple[str, dict[str, Any]]:
    """``case`` as (op, include entry): every dimension explicit, so the entry expands to the
    same case (the same id, in a suite named as ``case.suite``) for any kernel."""
    entry: dict[str, Any] = {
        "width": case.width,
        "dim": case.dim,
        "batch": case.batch,
        "x_dtype": case.x_dtype,
        "w_dtype": case.w_dtype,
        "layout": case.layout,
        "gap": case.gap or "none",
        "activation": case.activation or "none",
        "bias": case.bias,
    }
    if case.op == "update":
        entry |= {
            "tokens": case.tokens,
            "steps": case.steps,
            "state_len": case.state_len,
            "circular": bool(case.circular),
            "slots": case.slots or "none",
        }
    else:
        entry |= {
            "seqlen": case.seqlen,
            "initial_state": case.initial_state or "none",
            "final_state": bool(case.final_state),
            "packed": list(case.seq_lens) if case.seq_lens is not None else "none",
        }
        if case.op == "fwd_bwd":
            entry["dfinal"] = case.dfinal or "zero"
            entry["grad_layout"] = case.grad_layout or "none"
    if case.checks:
        entry["checks"] = list(case.checks)
    return case.op, entry


def _suite(op: str, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A suite whose only cases are ``entries``: its one grid row is the first entry itself
    (every dimension single-valued), so expanding adds no case of its own."""
    first = entries[0]
    dims = {k: [v] for k, v in first.items() if k != "checks"}
    return {
        "op": op,
        "strategy": "full",
        "dimensions": dims,
        "include": [dict(e) for e in entries],
    }


def matrix_text(
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    name: str,
    *,
    description: str = "",
    suites: Sequence[str] | None = None,
    timeout_s: float | None = None,
    memory_budget_mb: float | None = None,
) -> str:
    """A matrix file holding exactly ``entries`` (op, include entry), one suite per op
    (named ``SUITE_PREFIX`` + op unless ``suites`` names each entry's)."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    ops: dict[str, str] = {}
    for i, (op, entry) in enumerate(entries):
        suite = suites[i] if suites is not None else SUITE_PREFIX + op
        grouped.setdefault(suite, []).append(entry)
        ops[suite] = op
    document: dict[str, Any] = {"name": name}
    if description:
        document["description"] = description
    if timeout_s is not None:
        document["timeout_s"] = timeout_s
    if memory_budget_mb is not None:
        document["memory_budget_mb"] = memory_budget_mb
    document["suites"] = {s: _suite(ops[s], grouped[s]) for s in grouped}
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100)


def expand_entries(
    entries: Sequence[tuple[str, Mapping[str, Any]]], kernel: DeclaredKernel | None
) -> list[Case]:
    """The cases ``entries`` expand to for ``kernel``, in order, through the matrix language
    (``MatrixError`` when an entry is not a valid case)."""
    text = matrix_text(entries, "explore")
    spec = parse_matrix(load_yaml(text, "<explore>"), name="explore", path="<explore>",
                        content_hash="")  # fmt: skip
    return expand_matrix(spec, kernel).cases
