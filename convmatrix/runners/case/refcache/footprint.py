"""What an entry holds and weighs, decided from a case's parameters alone (no torch), and the
admission rule that keeps a stable subset of a run larger than the cache.

What judging reads from the reference (``execute._metrics``, ``runners.case.bounds``,
``runners.case.metrics``): per output, the reference values r (for |a - r|, its rms, e_rel's
max(|r|, tau)) and the bound of every element (``bound_of``: the magnitudes enter it only
through it). So an entry stores, per output (``R_FORMS``):

- r in float64 where the output is judged in float64; where it is judged in float32, r
  *split*: its float32 rounding hi and the rest in int8 units of 2^-31 |hi| (5 bytes; r' is
  within about 2^-32 |r| of r, 2^-8 of the output's own rounding term u_out |r|); in float32
  where it is judged in float16 or bfloat16 (|r - r'| <= 2^-24 |r|, at most 2^-13 of
  u_out |r|);
- the bound minus the zero floor eta, *plus |r - r'|*, rounded up to bfloat16
  (``compact.round_up``). Judged from r' under that bound, an output within the bound of the
  exact r is within it of r' (|a - r'| <= |a - r| + |r - r'|): the stored form never fails
  an honest output. It loosens the bound by less than 2^-7 (bfloat16's step; the verdict
  allows ``safety`` = 2 bounds) plus |r - r'|; 0 stays 0 exactly where the bound is eta (an
  element expected to be exactly 0, ``bounds.usage_of``); a bound below bfloat16's smallest
  subnormal (2^-133, no real data) rounds up to it;
- for the outputs a chunk-consistency call rounds once more than the case's own call
  (``SLACK_OUTPUTS``: dx, dw, db, dS, through the state's gradient carried between the two
  chunks and each chunk's partial sums; not y, whose chunks compute the same terms), the
  magnitudes (the sum of |terms|) rounded up to bfloat16: the check allows that extra
  rounding as a unit roundoff times them (``runners.case.agreement``), and an allowance 2^-7
  larger at most is still one unit roundoff's worth. (One number per block in their place,
  the largest mag / bound, was tried: where a bf16 output accumulates in float32 the bound
  of a cancelling element is tiny beside its magnitudes, the block's ratio reached 1/gamma,
  and chunk consistency passed a seeded bug it catches with the magnitudes.)

Cold, warm or off, a case is judged from this form (``compact.expand``), so the three
verdicts and usages are identical by construction. Bytes per element of x (B*C*L):
fwd_bwd 16 judged in float32 (y 5 + 2, dx 5 + 2 + 2), 14 in bf16/fp16 (y 4 + 2, dx
4 + 2 + 2); fwd 7 or 6. Version 3 stored r in float64 (float32 for bf16/fp16) and the bound
in float32: 26 and 18; version 1, r and three magnitudes in float64: 48.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from convmatrix.core.case import Case
from convmatrix.core.verdict import judged_dtype

__all__ = [
    "BLOCK_ELEMENTS",
    "SLACK_OUTPUTS",
    "Admission",
    "admit",
    "channels_per_block",
    "entry_bytes",
    "output_sizes",
    "overhead_bytes",
    "r_form",
]

# Elements per tensor of one channel block (512 KiB of float64), the unit a reference is
# computed, stored and judged in (``reference.channel_blocks``): a block's few dozen
# temporaries stay in cache and in memory the allocator already holds. Whole-tensor passes
# at C=4128, L=4096 (270 MB each) cost more in page faults and memory traffic than in
# arithmetic: benchmarks/bench_blocks.py measures the ratio.
BLOCK_ELEMENTS = 1 << 18
BOUND_BYTES = 2  # bfloat16 (float64 only where it would overflow: never for real data)
# How r is stored, by the dtype its output is judged in (see the module), and its bytes.
R_FORMS = {"float64": "float64", "float32": "split", "bfloat16": "float32", "float16": "float32"}
R_BYTES = {"float64": 8, "split": 5, "float32": 4}
MAG_BYTES = 2  # bfloat16, of SLACK_OUTPUTS only
# Outputs whose chunked calls round once more than the case's own (``runners.case.chunks``).
SLACK_OUTPUTS = frozenset({"dx", "dw", "db", "dS"})
# An entry's header: its key (about 3 KB) and a row per block (about 200 bytes per output,
# its two tensors' 64-byte alignment included).
_HEADER_BYTES, _ROW_BYTES = 4096, 256


def r_form(output: str, case: Case) -> str:
    """How r of ``output`` is stored and judged: ``float64``, ``split`` or ``float32``."""
    return R_FORMS[judged_dtype(output, case)]


def output_sizes(case: Case) -> dict[str, int]:
    """Elements of each output the reference of a forward case holds (none for updates:
    they are not cached)."""
    if case.op == "update" or case.seqlen is None:
        return {}
    tokens = case.batch * case.dim * case.seqlen
    state = case.batch * case.dim * (case.width - 1)
    sizes = {"y": tokens}
    if case.final_state:
        sizes["F"] = state
    if case.op == "fwd_bwd":
        sizes.update(dx=tokens, dw=case.dim * case.width)
        if case.bias:
            sizes["db"] = case.dim
        if case.initial_state not in (None, "none"):
            sizes["dS"] = state
    return sizes


def channels_per_block(batch: int, seqlen: int, width: int, elements: int) -> int:
    """Channels of one block of at most ``elements`` elements per (extended) tensor."""
    return max(1, elements // max(1, batch * (seqlen + width - 1)))


def overhead_bytes(case: Case) -> int:
    """An upper bound of what an entry of ``case`` holds besides its tensors' bytes."""
    assert case.seqlen is not None
    per = channels_per_block(case.batch, case.seqlen, case.width, BLOCK_ELEMENTS)
    blocks = -(-case.dim // per)
    return _HEADER_BYTES + blocks * len(output_sizes(case)) * _ROW_BYTES


def entry_bytes(case: Case) -> int:
    """The size of ``case``'s entry, at most ``overhead_bytes`` above its tensors' bytes
    (0 for a case that is not cached)."""
    sizes = output_sizes(case)
    if not sizes:
        return 0
    body = sum(
        n * (R_BYTES[r_form(o, case)] + BOUND_BYTES + (MAG_BYTES if o in SLACK_OUTPUTS else 0))
        for o, n in sizes.items()
    )
    return body + overhead_bytes(case)


@dataclass(frozen=True)
class Admission:
    """Which cases of a run may be cached: the largest that fit the limit together, decided
    once from the planned cases (the same set on the controller, every worker and every
    shard, and night after night for the same matrix), so a run larger than the cache keeps
    hitting on the same subset instead of evicting what the next night needs first."""

    admitted: frozenset[str]  # case ids
    cases: int  # planned cases that would be cached (forward ones)
    planned_bytes: int  # their entries together
    admitted_bytes: int
    limit_bytes: int

    @property
    def over(self) -> bool:
        return self.planned_bytes > self.limit_bytes

    def note(self, where: str) -> str:
        """The line a run prints before it starts when its references exceed the limit."""
        return (
            f"reference cache: the {self.cases} cached cases' references need about "
            f"{human_bytes(self.planned_bytes)}, over its limit of "
            f"{human_bytes(self.limit_bytes)} (--reference-cache-size); keeping the "
            f"{len(self.admitted)} largest that fit ({human_bytes(self.admitted_bytes)}) in "
            f"{where}, the others computed every run"
        )


def admit(cases: Iterable[Case], limit_bytes: int) -> Admission:
    """The largest cases first (ties by id), each kept while the total fits ``limit_bytes``."""
    sized = sorted(((entry_bytes(c), c.id) for c in cases), key=lambda s: (-s[0], s[1]))
    sized = [s for s in sized if s[0] > 0]
    kept, total = [], 0
    for size, case_id in sized:
        if total + size <= limit_bytes:
            kept.append(case_id)
            total += size
    planned = sum(size for size, _ in sized)
    return Admission(frozenset(kept), len(sized), planned, total, limit_bytes)


def human_bytes(n: float) -> str:
    """``1.5 GiB``, ``300 KiB``, ``12 B``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
