"""What a timing comparison is judged by and what it says of one timing: ``TimingRule`` (the
parameters of the pair rule, ``compare``/``pooled``) and ``TimingChange`` (one timing of the
kernel, base against head). Plain records shared by the rule's modules and the history rule.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TimingChange", "TimingRule"]


@dataclass(frozen=True)
class TimingRule:
    ratio: float = 1.1  # median(head) / median(base) above this is slower
    alpha: float = 0.01  # significance of the U test
    min_samples: int = 5
    control: str | None = "framework"  # scope measured beside each case; None: no correction
    # Never the kernel's claims: the control and the calibration rows.
    yardsticks: tuple[str, ...] = ("framework", "memcpy", "fma", "gemm")
    # A lone timing must leave the pair's noise band exp(z * sigma). The run-to-run moves are
    # heavy-tailed (A/A on a loaded 2-core host: whole cases moved x1.5-1.8 with a robust sigma
    # of x1.13; z = 3, 4, 5 claimed 18, 9, 2 of 455 A/A timings, z = 6 none).
    noise_z: float = 6.0
    # ... and never a band under this. With few cases the MAD can come out tiny when most
    # timings are exact (spun CPU time) while the smallest, overhead-dominated case moves: a
    # CI A/A pair (7 cases, loaded host) got a x1.14 band and its L=16 case's op and subgraph
    # timings moved x1.14 and x1.12 with p=0.005. One pair cannot tell such a move from a
    # regression; the history rule, which asks for persistence, can.
    min_noise: float = 1.25
    min_cases: int = 5  # fewer cases: no noise estimate, the per-timing test stands alone


@dataclass
class TimingChange:
    case_id: str
    name: str
    scope: str
    mode: str | None
    base_median_s: float
    head_median_s: float
    ratio: float  # head / base
    p_value: float | None  # None when not tested (too few samples)
    n_base: int
    n_head: int
    control_ratio: float | None = None  # head / base of the control (machine drift)
    corrected_ratio: float | None = None  # ratio / control_ratio
    corrected_p: float | None = None  # U test on samples divided by their control's median
    basis: str | None = None  # why a claim is made (kernel-wide, beyond the noise, ...)
