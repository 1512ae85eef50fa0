"""Bad outcomes that blame the machine, not the kernel: infrastructure is not a regression.

A case that ``failed`` was judged: the kernel ran and its outputs, its properties or its
exception (``kernel raised ...``) say what is wrong with it. Other bad outcomes say only that
the case could not be judged (``core.records.OUTCOMES``):

- ``timeout``: the per-case limit passed. A host under load pushes an honest case past it.
- ``lost``: no result arrived (a worker killed from outside, xdist out of restarts, a node).
- ``crashed`` where the process running the case died (a signal, the OOM killer): a kernel
  may cause that (a segfault), but one death does not say so. A kernel that raised a
  ``BaseException`` (``runners.case.interrupts.kernel_crash_message``: "the kernel raised ...")
  and a crash the executor already reproduced on another device (the Ray executor does, its
  ``retry_reason`` says so) are the kernel's.
- ``error``: the harness raised (``harness error: ...`` from ``runners.case.execute.run_guarded``,
  a pytest ``setup failed``/``teardown failed``). The kernel raising while its passed case was
  timed (``timing raised ...``) is the kernel's.

The scan lists these cases apart and opens no regression for them; ``convmatrix confirm``
reruns them with a longer limit (``RERUN_LIMIT_FACTOR``), and only what reproduces there
(``blames_kernel_when_reproduced``) becomes a regression: a timeout at four times the limit is
a hang, a second death a crash. A harness error never blames the kernel, however often it
happens. Pure: records in, plain records out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from convmatrix.core.records import BAD_OUTCOMES, CaseResult

__all__ = [
    "CAUSES",
    "RERUN_LIMIT_FACTOR",
    "Infrastructure",
    "blames_kernel_when_reproduced",
    "infrastructure",
    "infrastructure_cause",
    "infrastructure_lines",
]

# What a confirmation rerun multiplies the case's time limit by: a case that took 1.2x its
# limit on a busy host finishes; one that hangs still does not.
RERUN_LIMIT_FACTOR = 4.0
CAUSES = ("timeout", "lost worker", "harness error")

# The beginnings of the messages the runners write for bad outcomes that are the kernel's
# (tests/test_infrastructure.py holds them to the functions that write them).
_KERNEL_CRASH = "the kernel raised "  # runners.case.interrupts.kernel_crash_message
_CRASH_REPRODUCED = "confirming on another device"  # the Ray executor's retry reason
_KERNEL_TIMING = "timing raised "  # runners.case.execute._time


@dataclass(frozen=True)
class Infrastructure:
    """One case the machine failed to judge: its outcome, why it is not the kernel's."""

    case_id: str
    name: str
    outcome: str
    cause: str  # one of CAUSES
    message: str | None

    def line(self) -> str:
        message = (self.message or "").splitlines()[0] if self.message else ""
        return f"{self.cause:<13} {self.name}" + (f": {message[:160]}" if message else "")


def infrastructure_cause(result: CaseResult) -> str | None:
    """Why ``result``'s bad outcome is the machine's (one of ``CAUSES``); None when it is
    the kernel's (or the case is not bad)."""
    message = result.message or ""
    if result.outcome == "timeout":
        return "timeout"
    if result.outcome == "lost":
        return "lost worker"
    if result.outcome == "crashed":
        if message.startswith(_KERNEL_CRASH) or _CRASH_REPRODUCED in (result.retry_reason or ""):
            return None
        return "lost worker"
    if result.outcome == "error" and not message.startswith(_KERNEL_TIMING):
        return "harness error"
    return None


def blames_kernel_when_reproduced(cause: str) -> bool:
    """Whether the same cause again on a rerun with a longer limit is the kernel's: a hang
    or a crash is, a harness error never."""
    return cause != "harness error"


def infrastructure(results: Iterable[CaseResult]) -> list[Infrastructure]:
    """The cases of ``results`` the machine failed to judge, by name."""
    found = [
        Infrastructure(r.case.id, r.case.pytest_id, r.outcome, cause, r.message)
        for r in results
        if r.outcome in BAD_OUTCOMES and (cause := infrastructure_cause(r)) is not None
    ]
    return sorted(found, key=lambda i: i.name)


def infrastructure_lines(cases: list[Infrastructure], limit: int = 20) -> list[str]:
    """What a terminal shows of them: a headline and one line per case (``limit`` at most)."""
    if not cases:
        return []
    counts = Counter(c.cause for c in cases)
    causes = ", ".join(f"{n} {cause}" for cause, n in sorted(counts.items()))
    lines = [
        f"infrastructure: {len(cases)} cases not judged ({causes}): no regression unless a "
        "rerun with a longer limit reproduces them (convmatrix confirm, run --confirm)"
    ]
    lines += [f"  {c.line()}" for c in cases[:limit]]
    if len(cases) > limit:
        lines.append(f"  ... and {len(cases) - limit} more")
    return lines
