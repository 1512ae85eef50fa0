"""A run's options as its database row keeps them (``RunMeta.options``), read back.

A run stores one form: the options it was made of, one key per field of
``convmatrix.runners.options.RunOptions`` (``RunOptions.recorded``), plus, under ``facts``, what
the run found out rather than was asked (the matrix files it loaded, the arithmetic its kernel
declared, the threads each process got, what the kernel says it loaded, a shrink's result).

Runs recorded before this form kept a few options under older names beside those facts, at the
top level; ``RENAMED`` maps each such key to its field, so every database still reads. This
module is the one reader of the stored dict (torch-free, no argparse): the layers below the
runners read it here, and ``RunOptions.from_recorded`` builds on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FACTS", "RENAMED", "Recorded", "stored_options"]

FACTS = "facts"  # the key of the run's facts
_OLD = "matrix_sources"  # a fact every older release kept at the top level, beside the options
# Old rows (``_OLD`` at the top): option key -> RunOptions field. Keys absent here were facts.
RENAMED = {
    "kernel_spec": "kernel",
    "case_timeout_s": "case_timeout",
    "policy": "rule",
    "workers": "workers",
    "executor": "executor",
    "device": "device",
    "cases": "cases",
    "reference_device": "reference_device",
}


def stored_options(given: Mapping[str, Any], **facts: Any) -> dict[str, Any]:
    """The dict a run stores: its options by field name (``RunOptions.recorded``) and ``facts``."""
    return {**given, FACTS: dict(facts)}


@dataclass(frozen=True)
class Recorded:
    """A run's stored options, read: ``given`` (field name -> JSON value; an old row has only the
    few it kept) and the run's facts, each through one accessor."""

    given: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> Recorded:
        """The row's options as stored by this release or an older one (``RENAMED``)."""
        stored = dict(stored or {})
        if _OLD not in stored or FACTS in stored:  # this form (``RunOptions.recorded`` alone too)
            facts = stored.pop(FACTS, None) or {}
            return cls(stored, dict(facts))
        given = {RENAMED[k]: v for k, v in stored.items() if k in RENAMED}
        facts = {k: v for k, v in stored.items() if k not in RENAMED}  # "kernel": described
        return cls(given, facts)

    @property
    def matrix_sources(self) -> list[str]:
        """What the run loaded: built-in matrix names or absolute paths."""
        return list(self.facts.get("matrix_sources") or [])

    def matrix(self, fallback: str) -> str:
        """The matrix a rerun gives ``--matrix``: the run's one source, else ``fallback`` (the
        run's matrix name)."""
        sources = self.matrix_sources
        return sources[0] if len(sources) == 1 else fallback

    @property
    def kernel_spec(self) -> str | None:
        """The ``--kernel`` spec the run loaded (a name or module:attr), when recorded."""
        return self.given.get("kernel") or None

    def kernel(self, fallback: str) -> str:
        """The ``--kernel`` spec the run loaded, else ``fallback`` (the kernel's name)."""
        return str(self.kernel_spec or fallback)

    def device(self, fallback: str) -> str:
        """``--device`` as the run was given it (``auto``, ``cuda``...), else ``fallback``."""
        return str(self.given.get("device") or fallback)

    @property
    def case_timeout(self) -> float | None:
        """``--case-timeout`` in seconds (None: the matrix's)."""
        value = self.given.get("case_timeout")
        return None if value is None else float(value)

    @property
    def arithmetic(self) -> dict[str, Any] | None:
        """What the kernel declared its arithmetic to be (``compare.errors.Declared.of``)."""
        return self.facts.get("arithmetic")

    @property
    def threads(self) -> dict[str, Any] | None:
        """The threads each process that ran cases got (``ThreadSetting.record``; CPU runs)."""
        return self.facts.get("threads")

    @property
    def described(self) -> dict[str, Any] | None:
        """What the kernel says it loaded (an adapter's library, layout...), as JSON."""
        return self.facts.get("kernel")
