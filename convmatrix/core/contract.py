"""A kernel's declared contract: what it accepts, which features it has, its tile geometry.

Plain data, below the matrix language: the matrix classifies cases against it (a case outside
the contract is an expected-error case, a missing feature a skip), the runners build a case's
tensors by it (slot ids, which inputs a call may overwrite) and never make a call it refuses
(``refusal``: property checks ask it for every call they would make), and kernels declare it.
``ContractError`` is what a kernel raises for inputs outside its contract.

The fields say what real kernels need (read from their sources; see each adapter's docstring):
a decode state of one length only (vLLM S == K-1, fla S == K: ``state_lens``), one token per
update call (``max_update_tokens``), other widths for the update than for the forward
(``update_widths``), a final state kept per packed sequence, only without packing, or not at
all (``final_state``), y written into x's buffer (``inplace_y``), and the slot id that marks a
padding row (``pad_slot_id``: vLLM's null block is row 0, docs/spec.md §2 says -1).

The arithmetic a kernel declares feeds the bound model (docs/spec.md §4,
``convmatrix.core.bounds``): the dtype it accumulates in (``accumulate``), whether its
intermediate results stay FP32 or are rounded to the input dtype (``intermediate``: the
framework path and fla compute in the input dtype), and whether its forward is
deterministic (``deterministic``: only then must causality and packed isolation hold bit for
bit; otherwise they fall back to the bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from convmatrix.core.bounds import INTERMEDIATES
from convmatrix.core.case import Case
from convmatrix.core.dtypes import CASE_DTYPES, UNIT_ROUNDOFF

__all__ = [
    "ALL_DTYPE_PAIRS",
    "FEATURES",
    "FINAL_STATES",
    "INPLACE_CALLS",
    "LAYOUTS",
    "STATE_LEN_ANY",
    "STATE_LEN_K",
    "STATE_LEN_K_MINUS_1",
    "Capabilities",
    "ContractError",
    "DeclaredKernel",
    "Geometry",
    "StateLens",
    "refusal",
]

ALL_DTYPE_PAIRS = frozenset((x, w) for x in CASE_DTYPES for w in CASE_DTYPES)
LAYOUTS = frozenset({"channel_first", "channel_last"})
FEATURES = frozenset(
    {
        "backward",  # outputs differentiable w.r.t. x, weight, bias, initial_state
        "initial_state",
        "final_state",
        "packed",  # seq_idx
        "update",  # decode update with a shifting state
        "ring_buffer",  # update with cache_seqlens
        "slot_indices",  # update with state_indices (continuous batching)
    }
)
# What a forward's final state is when the row is packed (docs/spec.md §2 wants "row"):
#   row          - the row's last K-1 inputs, across sequence boundaries;
#   per_sequence - the state of the row's last sequence, started from zeros (varlen APIs:
#                  vLLM, fla, torch_mlu_ops): the same unless that sequence is shorter than
#                  K-1 and not the whole row, which is then outside the contract;
#   unpacked     - only without packing: seq_idx with a final state is refused (Dao);
#   none         - no final state at all (a missing feature: such cases are skipped).
FINAL_STATES = ("row", "per_sequence", "unpacked", "none")
# Calls whose y the harness can accept in x's buffer (vLLM's update: ``out = x``).
INPLACE_CALLS = frozenset({"update"})


class ContractError(ValueError):
    """Raised by a kernel for inputs outside its declared contract.

    Distinct from a crash or a wrong answer: an expected-error case passes only when the kernel
    raises this (or the kernel's documented exception, see ``Capabilities.error_types``).
    """


@dataclass(frozen=True)
class Geometry:
    """Tile geometry a kernel declares; the matrix resolves symbolic values from it.

    ``time_tile`` is T, ``channel_tile`` C_t, ``vector_width`` the channel vector width,
    ``partial_groups`` P (per-channel partial sums of dw/db). ``None`` means "not declared":
    a matrix that uses e.g. ``tile+1`` against such a kernel gets a clear error.
    """

    time_tile: int | None = None
    channel_tile: int | None = None
    vector_width: int | None = None
    partial_groups: int | None = None

    def symbols(self) -> dict[str, int]:
        """Symbol name → value for the declared parts (``tile``, ``ctile``, ``vec``, ``P``)."""
        names = {
            "tile": self.time_tile,
            "ctile": self.channel_tile,
            "vec": self.vector_width,
            "P": self.partial_groups,
        }
        return {k: v for k, v in names.items() if v is not None}


@dataclass(frozen=True)
class StateLens:
    """Decode state lengths S an update accepts, relative to the width K:
    ``K-1 + min_extra <= S <= K-1 + max_extra`` (``max_extra=None``: no upper bound).

    Relative because real kernels tie S to K: vLLM shifts only the first K-1 columns of its
    state (S == K-1, ``StateLens(0, 0)``), fla keeps W columns (S == K, ``StateLens(1, 1)``),
    Dao takes any S >= K-1 (``StateLens()``). S < K-1 is outside docs/spec.md §2 for all.
    """

    min_extra: int = 0
    max_extra: int | None = None

    def __post_init__(self) -> None:
        if self.min_extra < 0 or (self.max_extra is not None and self.max_extra < self.min_extra):
            raise ValueError(f"invalid StateLens({self.min_extra}, {self.max_extra})")

    def accepts(self, width: int, state_len: int) -> bool:
        extra = state_len - (width - 1)
        return extra >= self.min_extra and (self.max_extra is None or extra <= self.max_extra)

    def __str__(self) -> str:
        def term(extra: int) -> str:
            return {0: "K-1", 1: "K"}.get(extra, f"K+{extra - 1}")

        if self.max_extra == self.min_extra:
            return f"S == {term(self.min_extra)}"
        if self.max_extra is None:
            return f"S >= {term(self.min_extra)}"
        return f"{term(self.min_extra)} <= S <= {term(self.max_extra)}"


STATE_LEN_ANY = StateLens()
STATE_LEN_K_MINUS_1 = StateLens(0, 0)
STATE_LEN_K = StateLens(1, 1)


def _last_run(seq_lens: tuple[int, ...]) -> tuple[int, bool]:
    """(length of the row's last run of one sequence id, whether it is the whole row).
    Adjacent padding segments share the id -1 and so form one run."""
    length, i = abs(seq_lens[-1]), len(seq_lens) - 1
    while seq_lens[-1] < 0 and i > 0 and seq_lens[i - 1] < 0:
        i -= 1
        length += -seq_lens[i]
    return length, i == 0


@dataclass(frozen=True)
class Capabilities:
    """A kernel's declared contract (see the module docstring for why each field exists).

    ``widths`` are the forward's (``None``: any width >= 1); ``update_widths`` the update's
    when they differ (``None``: the same as ``widths``). ``final_state="none"`` and a
    ``features`` set without ``"final_state"`` say the same thing; each implies the other.
    """

    widths: frozenset[int] | None = None
    dtype_pairs: frozenset[tuple[str, str]] = ALL_DTYPE_PAIRS
    layouts: frozenset[str] = LAYOUTS
    features: frozenset[str] = FEATURES
    geometry: Geometry = field(default_factory=Geometry)
    # Exceptions other than ContractError that the kernel documents for contract violations
    # (e.g. Dao's extension raises RuntimeError from TORCH_CHECK).
    error_types: tuple[type[BaseException], ...] = ()
    update_widths: frozenset[int] | None = None
    state_lens: StateLens = STATE_LEN_ANY
    max_update_tokens: int | None = None  # new tokens per update call; None: any
    final_state: str = "row"  # one of FINAL_STATES
    inplace_y: frozenset[str] = frozenset()  # calls (INPLACE_CALLS) that write y into x
    pad_slot_id: int = -1  # the state_indices value that marks a padding row
    accumulate: str = "float32"  # the dtype sums of products are accumulated in
    intermediate: str = "fp32"  # "fp32" | "input": intermediates rounded to the input dtype
    deterministic: bool = True  # the same inputs give the same bits (forward)

    def __post_init__(self) -> None:
        if self.accumulate not in UNIT_ROUNDOFF:
            raise ValueError(f"accumulate must be one of {sorted(UNIT_ROUNDOFF)}")
        if self.intermediate not in INTERMEDIATES:
            raise ValueError(f"intermediate must be one of {INTERMEDIATES}")
        if self.final_state not in FINAL_STATES:
            raise ValueError(f"final_state must be one of {FINAL_STATES}, got {self.final_state!r}")
        if not self.inplace_y <= INPLACE_CALLS:
            raise ValueError(f"inplace_y: only {sorted(INPLACE_CALLS)} is supported")
        if self.max_update_tokens is not None and self.max_update_tokens < 1:
            raise ValueError("max_update_tokens must be >= 1 (or None)")
        if self.final_state == "none":
            object.__setattr__(self, "features", self.features - {"final_state"})
        elif "final_state" not in self.features:
            object.__setattr__(self, "final_state", "none")

    def widths_for(self, op: str) -> frozenset[int] | None:
        """The widths a call of ``op`` (``fwd``, ``fwd_bwd``, ``update``) accepts."""
        if op == "update" and self.update_widths is not None:
            return self.update_widths
        return self.widths

    def missing_features(self, case: Case) -> list[str]:
        """Features the case needs that the kernel lacks: such cases are skipped, not failed."""
        return sorted(case.required_features() - self.features)

    def contract_violation(self, case: Case) -> str | None:
        """Why the declared contract rejects this case, or None. Rejected = expected error."""
        widths = self.widths_for(case.op)
        if widths is not None and case.width not in widths:
            what = "update width" if widths is not self.widths else "width"
            return f"{what} {case.width} not in {sorted(widths)}"
        if (case.x_dtype, case.w_dtype) not in self.dtype_pairs:
            return f"dtype pair ({case.x_dtype}, {case.w_dtype}) not supported"
        if case.layout not in self.layouts:
            return f"layout {case.layout} not supported"
        if case.op == "update":
            return self._update_violation(case)
        return self._final_state_violation(case)

    def _update_violation(self, case: Case) -> str | None:
        if case.state_len is not None and not self.state_lens.accepts(case.width, case.state_len):
            got = f"S={case.state_len} with K={case.width}"
            return f"decode state needs {self.state_lens}, got {got}"
        limit = self.max_update_tokens
        if limit is not None and case.tokens is not None and case.tokens > limit:
            count = "one token" if limit == 1 else f"at most {limit} tokens"
            return f"update takes {count} per call, got {case.tokens}"
        return None

    def _final_state_violation(self, case: Case) -> str | None:
        if not case.final_state or case.seq_lens is None:
            return None
        if self.final_state == "unpacked":
            return "final state only without packing (seq_idx)"
        if self.final_state == "per_sequence":
            length, whole = _last_run(case.seq_lens)
            if not whole and length < case.width - 1:
                return (
                    f"packed row ends in a sequence shorter than K-1 ({length} < {case.width - 1}"
                    " tokens): the final state is per sequence"
                )
        return None


class DeclaredKernel(Protocol):
    """What the matrix needs of a kernel to expand cases for it: its name, its declared
    geometry (``capabilities.geometry`` resolves ``tile+1``...) and its contract. Every kernel
    (``convmatrix.kernels.interface.protocol.Kernel``) is one."""

    name: str
    capabilities: Capabilities

    def contract_violation(self, case: Case) -> str | None: ...


def refusal(kernel: DeclaredKernel, case: Case) -> str | None:
    """Why ``kernel`` must not be called with the arguments ``case`` describes: a feature it
    lacks or a contract it declares (its own ``contract_violation``, hand-written rules
    included), else None. The harness asks this before every call it makes of its own accord."""
    missing = kernel.capabilities.missing_features(case)
    if missing:
        return f"kernel lacks feature(s) {', '.join(missing)}"
    return kernel.contract_violation(case)
