"""A scalar reference in pure Python floats for one (batch, channel) row, no torch.

Written from the window formula independently of ``reference.py`` (like the seed's
``reference.py``): it shares no code with the vectorised oracle, so agreement between the two
is evidence about both. Depthwise channels are independent, so a whole tensor is checked by
calling this per row and summing parameter gradients over rows.

Row conventions: ``x`` has L floats, ``w`` K floats (``w[K-1]`` multiplies the current token),
``s0`` the K-1 inputs preceding ``x[0]`` (oldest first), ``g`` = dL/dy (L), ``q`` = dL/dF (K-1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RowGrads", "row_backward", "row_forward"]


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def row_forward(
    x: list[float], w: list[float], b: float, s0: list[float], silu: bool
) -> tuple[list[float], list[float], list[float]]:
    """(y, final_state, z) of one row."""
    k_w = len(w)
    history = list(s0) + list(x)  # index i + (K-1) holds x[i]
    z: list[float] = []
    for t in range(len(x)):
        acc = b
        for k in range(k_w):
            acc += w[k] * history[t + k]
        z.append(acc)
    y = [v * _sigmoid(v) for v in z] if silu else list(z)
    final = history[len(history) - (k_w - 1) :] if k_w > 1 else []
    return y, final, z


@dataclass
class RowGrads:
    dx: list[float]
    dw: list[float]
    db: float
    ds: list[float]


def row_backward(
    x: list[float],
    w: list[float],
    b: float,
    s0: list[float],
    g: list[float],
    q: list[float],
    silu: bool,
) -> RowGrads:
    """Gradients of L = <g, y> + <q, F> for one row, accumulated tap by tap."""
    k_w, n = len(w), len(x)
    history = list(s0) + list(x)
    _, _, z = row_forward(x, w, b, s0, silu)
    dhist = [0.0] * len(history)
    dw = [0.0] * k_w
    db = 0.0
    for t in range(n):
        if silu:
            s = _sigmoid(z[t])
            dz = g[t] * s * (1.0 + z[t] * (1.0 - s))
        else:
            dz = g[t]
        db += dz
        for k in range(k_w):
            dhist[t + k] += w[k] * dz
            dw[k] += dz * history[t + k]
    # The final state is the last K-1 entries of the history: its gradient lands there directly.
    for i, qi in enumerate(q):
        dhist[len(history) - (k_w - 1) + i] += qi
    return RowGrads(dx=dhist[k_w - 1 :], dw=dw, db=db, ds=dhist[: k_w - 1])
