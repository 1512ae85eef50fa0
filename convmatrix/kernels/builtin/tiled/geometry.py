"""The tiled kernel's geometry: defaults, validation, and the textual form used by specs.

A geometry is ``Geometry(time_tile=T, channel_tile=C_t, vector_width=vec, partial_groups=P)``
(``convmatrix.kernels.interface.protocol``), declared to the matrix so that ``tile-1``, ``ctile+1``,
``vec-1`` ... resolve to this kernel's real boundaries. Its textual form, used by
``CONVMATRIX_TILED_GEOMETRY`` and ``convmatrix.kernels.builtin.tiled:make(T=128,P=2)`` specs, is a
comma-separated list of ``key=value`` with keys ``T``, ``C_t``, ``vec``, ``P`` (or the field
names). ``vec`` is the lane count of one vector multiply-add: C_t must be a whole number of
vectors. The torch emulation computes all lanes of a tile together, so vec shapes the
planner's candidates and the matrix's channel counts rather than the arithmetic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from convmatrix.core.contract import Geometry
from convmatrix.core.environment import GEOMETRY_KEYS, check_geometry_value
from convmatrix.core.errors import UsageError

__all__ = ["DEFAULT_GEOMETRY", "ENV_VAR", "geometry_from_env", "make_geometry", "parse_geometry"]

DEFAULT_GEOMETRY = Geometry(time_tile=64, channel_tile=32, vector_width=8, partial_groups=4)
ENV_VAR = "CONVMATRIX_TILED_GEOMETRY"

_KEYS = GEOMETRY_KEYS  # declared with their bounds in core.environment


def make_geometry(base: Geometry = DEFAULT_GEOMETRY, **values: int) -> Geometry:
    """``base`` with the given fields (short or long names) replaced, validated."""
    fields = {
        "time_tile": base.time_tile,
        "channel_tile": base.channel_tile,
        "vector_width": base.vector_width,
        "partial_groups": base.partial_groups,
    }
    for key, value in values.items():
        why = check_geometry_value(key, value)  # known key, 1 <= value <= its bound
        if why:
            raise UsageError(why)
        fields[_KEYS[key]] = value
    geometry = Geometry(**fields)
    if geometry.channel_tile % geometry.vector_width:
        raise UsageError(
            f"tiled geometry: channel tile C_t={geometry.channel_tile} is not a multiple of "
            f"the vector width vec={geometry.vector_width}"
        )
    return geometry


def parse_geometry(text: str, base: Geometry = DEFAULT_GEOMETRY) -> Geometry:
    """``"T=128, C_t=16, vec=8, P=2"`` → Geometry (missing keys keep ``base``)."""
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"tiled geometry {text!r}: expected key=value, got {item!r}")
        try:
            values[key.strip()] = int(raw.strip())
        except ValueError:
            raise UsageError(
                f"tiled geometry {text!r}: {key.strip()}={raw.strip()!r} is not an integer"
            ) from None
    return make_geometry(base, **values)


def geometry_from_env(environ: Mapping[str, str] | None = None) -> Geometry:
    """The default geometry, overridden by ``CONVMATRIX_TILED_GEOMETRY`` when set."""
    text = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not text:
        return DEFAULT_GEOMETRY
    try:
        return parse_geometry(text)
    except UsageError as exc:
        raise UsageError(f"{ENV_VAR}: {exc}") from None
