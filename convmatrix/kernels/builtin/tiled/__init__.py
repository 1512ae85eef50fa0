"""The ``tiled`` kernel (the seed's MLU design on any torch device) and its factories.

Ways to get one:

- ``convmatrix run --kernel tiled``: the default geometry, or ``CONVMATRIX_TILED_GEOMETRY``
  (``"T=128,C_t=16,vec=8,P=2"``) when set; ``--kernel tiled-small`` is T=16, C_t=8, vec=4, P=2;
- ``--kernel 'convmatrix.kernels.builtin.tiled:make(T=128,P=2)'``: any geometry, resolved by this
  module's ``__getattr__``; ``make(budget=BYTES)`` takes the planner's best tile for that
  on-chip budget (see ``convmatrix.kernels.builtin.planner``);
- in Python: ``TiledKernel(T=128)`` or ``make(...)``.
"""

from __future__ import annotations

from typing import Any

from convmatrix.core.errors import UsageError
from convmatrix.kernels.builtin.tiled.geometry import (
    DEFAULT_GEOMETRY,
    ENV_VAR,
    make_geometry,
    parse_geometry,
)
from convmatrix.kernels.builtin.tiled.kernel import TiledFunction, TiledKernel

__all__ = [
    "DEFAULT_GEOMETRY",
    "ENV_VAR",
    "TiledFunction",
    "TiledKernel",
    "make",
    "make_geometry",
    "parse_geometry",
    "small",
]

_PLAN_KEYS = ("budget", "width", "dtype", "dim", "double_buffer")


def make(**options: Any) -> TiledKernel:
    """A tiled kernel from geometry keys (``T``, ``C_t``, ``vec``, ``P``) and/or a planner
    budget: ``make(budget=262144, dtype="bfloat16/float32", width=4, dim=4096)`` ranks tiles
    for that budget and takes the best one; explicit geometry keys override it."""
    plan_options = {k: options.pop(k) for k in _PLAN_KEYS if k in options}
    base = DEFAULT_GEOMETRY
    if plan_options:
        if "budget" not in plan_options:
            raise UsageError(f"tiled make(): {sorted(plan_options)} need budget=BYTES")
        from convmatrix.kernels.builtin.planner import geometry_for_budget

        # The vector width bounds the planner's channel tiles; P sizes its workspace.
        for key, name in (("vec", "vec"), ("P", "partial_groups")):
            if key in options:
                plan_options[name] = options.pop(key)
        base = geometry_for_budget(**plan_options)
    return TiledKernel(make_geometry(base, **options))


def small() -> TiledKernel:
    """Small tiles (T=16, C_t=8, vec=4, P=2): tile boundaries at short lengths, cheap to run."""
    return TiledKernel(make_geometry(DEFAULT_GEOMETRY, T=16, C_t=8, vec=4, P=2))


def _parse_call(text: str) -> dict[str, Any]:
    """``T=128,dtype=bfloat16/float32`` → keyword arguments (integers where they parse)."""
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"tiled spec make({text}): expected key=value, got {item!r}")
        raw = raw.strip().strip("'\"")
        try:
            options[key.strip()] = int(raw)
        except ValueError:
            options[key.strip()] = {"true": True, "false": False}.get(raw.lower(), raw)
    return options


def __getattr__(name: str) -> Any:
    """Resolve ``make(...)`` attribute specs, e.g.
    ``convmatrix.kernels.builtin.tiled:make(T=128)``."""
    if name.startswith("make(") and name.endswith(")"):
        return make(**_parse_call(name[len("make(") : -1]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
