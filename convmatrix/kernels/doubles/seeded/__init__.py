"""Seeded-bug kernels: ``tiled`` with exactly one realistic bug each, to measure a matrix.

``convmatrix adequacy --matrix M`` runs every kernel of ``CATALOGUE`` through M and reports
which cases kill which bug (docs/adequacy.md). Each kernel is also a kernel of its own:
``convmatrix run --kernel seeded:taps_reversed``; ``convmatrix kernels --seeded`` lists them.

Bugs come from the seed's table (docs/spec.md §3, one per bug class it names) and from the
upstream catalogue (../shared/research/upstream_bugs.md: Dao's causal-conv1d, vLLM, sglang,
fla, mamba, TensorRT-LLM), each citing its issue or commit, wherever the matrix language can
express the trigger. ``Bug.trigger`` / ``Bug.quiet`` are overrides of ``base_case``.

``SIZE_CATALOGUE`` holds the bugs that show only past a size (``size_bugs``: 2^24 elements,
a B*L workspace, 1024 channels, 4096 tokens), kept apart: no fixed matrix reaches them, and
``CATALOGUE`` is what a matrix is measured against by default (``--catalogue size`` for
these). ``load`` and ``seeded:NAME`` find a bug of either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.errors import UsageError
from convmatrix.kernels.doubles.seeded.backward_bugs import BACKWARD_BUGS
from convmatrix.kernels.doubles.seeded.base import DIMENSIONS, Bug, SeededKernel, Threshold
from convmatrix.kernels.doubles.seeded.forward_bugs import FORWARD_BUGS
from convmatrix.kernels.doubles.seeded.size_bugs import SIZE_BUGS
from convmatrix.kernels.doubles.seeded.update_bugs import UPDATE_BUGS
from convmatrix.matrix.errors import did_you_mean

__all__ = [
    "CATALOGUE",
    "CATALOGUES",
    "DIMENSIONS",
    "PREFIX",
    "SIZE_CATALOGUE",
    "Bug",
    "SeededKernel",
    "Threshold",
    "base_case",
    "listed",
    "load",
    "names",
]

PREFIX = "seeded:"

CATALOGUE: Mapping[str, type[SeededKernel]] = {
    cls.bug.name: cls for cls in (*FORWARD_BUGS, *BACKWARD_BUGS, *UPDATE_BUGS)
}
SIZE_CATALOGUE: Mapping[str, type[SeededKernel]] = {cls.bug.name: cls for cls in SIZE_BUGS}
# What ``convmatrix adequacy --catalogue`` measures a matrix against.
CATALOGUES: Mapping[str, Mapping[str, type[SeededKernel]]] = {
    "main": CATALOGUE,
    "size": SIZE_CATALOGUE,
    "all": {**CATALOGUE, **SIZE_CATALOGUE},
}

_FWD_BASE: dict[str, Any] = {
    "suite": "seeded", "op": "fwd_bwd", "width": 4, "dim": 8, "batch": 1, "seqlen": 8,
    "initial_state": "none", "final_state": False,
}  # fmt: skip
_UPDATE_BASE: dict[str, Any] = {
    "suite": "seeded", "op": "update", "width": 4, "dim": 8, "batch": 2, "tokens": 1,
    "steps": 1, "state_len": 3, "circular": False, "slots": None,
}  # fmt: skip


def base_case(overrides: Mapping[str, Any]) -> Case:
    """A small case (fwd_bwd, or update when ``overrides['op']`` says so) with overrides."""
    base = _UPDATE_BASE if overrides.get("op") == "update" else _FWD_BASE
    fields = {**base, **overrides}
    if fields["op"] == "fwd_bwd" and fields.get("final_state") and "dfinal" not in fields:
        fields["dfinal"] = "zero"
    return Case(**fields)


def names(catalogue: str = "main") -> list[str]:
    return list(CATALOGUES[catalogue])


def load(name: str) -> SeededKernel:
    """The seeded kernel ``name`` (with or without the ``seeded:`` prefix), of either
    catalogue."""
    name = name.removeprefix(PREFIX)
    every = CATALOGUES["all"]
    if name not in every:
        raise UsageError(f"unknown seeded bug {name!r}{did_you_mean(name, every)}")
    return every[name]()


def listed() -> list[tuple[str, str]]:
    """(``seeded:NAME``, ``module:class``) of every seeded kernel: the family's entries in
    ``convmatrix kernels --seeded`` (the registry finds this family by its prefix,
    ``convmatrix.kernels.interface.registry``)."""
    every = CATALOGUES["all"]
    return [(PREFIX + name, f"{cls.__module__}:{cls.__name__}") for name, cls in every.items()]
