"""The run report's performance part: scopes side by side, the device's rates, the sweeps.

Built from a run's timing rows (``convmatrix.runners.case.timing.cases``); plain data, written to
JSON with the rest of the run view. Two kinds of sweep chart, one per group of timed cases that
differ only in ``seqlen`` (docs/spec.md §5, the seed's "change one factor at a time"):

- ``bytes``: median time of each scope against the bytes D the op must move. ``slope`` is the
  least-squares slope of log(time) on log(D): near 1 the time grows with the bytes (bandwidth,
  or a per-tile cost proportional to them), near 0 it is flat (launch and Python overhead);
- ``tiles`` (``fwd_bwd`` only): the backward alone (``kernel.bwd``, ``op.bwd``) against the
  number of time tiles ``ceil(L / tile)`` (``tile`` from the kernel's declared geometry; the
  length itself when it declares none). ``per_tile_s`` is the fitted cost of one more tile:
  the per-tile partial sums and the reduction.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convmatrix.core.records import CaseResult, TimingResult

__all__ = [
    "PerformanceSection",
    "ScopeRow",
    "SweepChart",
    "SweepSeries",
    "build_performance_section",
    "scope_key",
]

_RATES = ("fma", "gemm")  # calibration rows: rates, not columns
# Column order of the side-by-side table: the kernel's scopes, then the yardsticks.
_ORDER = ("kernel", "kernel~op", "kernel.bwd", "op", "op.bwd", "subgraph", "framework", "memcpy")
_BYTES_SCOPES = ("kernel", "kernel~op", "op", "subgraph", "framework", "memcpy")
_TILE_SCOPES = ("kernel.bwd", "op.bwd")


def scope_key(t: TimingResult) -> str:
    """``op`` or ``op[reset]``: a timing's column (scope plus update mode)."""
    return f"{t.scope}[{t.mode}]" if t.mode else t.scope


@dataclass
class ScopeRow:
    """One timed case: each scope's median and efficiency, and two ratios that matter."""

    case_id: str
    name: str
    suite: str
    median_s: dict[str, float]  # scope key -> median
    efficiency: dict[str, float | None]
    op_vs_kernel: float | None  # what the public call adds around the core
    op_vs_framework: float | None  # < 1: faster than what a PyTorch user writes
    op_vs_memcpy: float | None  # Dao's yardstick: "as fast as a memcpy" is 1


@dataclass
class SweepSeries:
    scope: str
    x: list[float]
    median_s: list[float]
    slope: float | None = None  # bytes charts: d log t / d log D
    per_tile_s: float | None = None  # tiles charts: fitted seconds per extra time tile


@dataclass
class SweepChart:
    kind: str  # bytes | tiles
    title: str
    x_label: str
    x: list[float]
    series: list[SweepSeries]


@dataclass
class PerformanceSection:
    bandwidth: list[float] = field(default_factory=list)  # B/s per distinct calibration
    compute: list[float] = field(default_factory=list)  # flop/s, element-wise FMA
    dense: list[float] = field(default_factory=list)  # flop/s, fp32 GEMM (subgraph bounds)
    scopes: list[str] = field(default_factory=list)  # columns: scopes, ``op[advance]``
    rows: list[ScopeRow] = field(default_factory=list)
    charts: list[SweepChart] = field(default_factory=list)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _first(by: Mapping[str, float], *keys: str) -> float | None:
    return next((by[k] for k in keys if k in by), None)


def _column(t: TimingResult) -> str | None:
    """The side-by-side column of a timing: a scope's main mode (none, ``reset``; the
    subgraph's ``advance``) under the scope's name, the op's ``advance`` apart; the framework's
    second mode only in the full table (None)."""
    if t.scope in _RATES:
        return None
    if t.mode in (None, "reset") or t.scope == "subgraph":
        return t.scope
    return scope_key(t) if not t.scope.startswith("framework") else None


def _row(result: CaseResult) -> ScopeRow:
    cells = [(_column(t), t) for t in result.timings]
    medians = {c: t.median_s for c, t in cells if c is not None}
    op = medians.get("op")
    return ScopeRow(
        case_id=result.case.id,
        name=result.case.pytest_id,
        suite=result.case.suite,
        median_s=medians,
        efficiency={c: t.efficiency for c, t in cells if c is not None},
        op_vs_kernel=_ratio(op, _first(medians, "kernel", "kernel~op")),
        op_vs_framework=_ratio(op, medians.get("framework")),
        op_vs_memcpy=_ratio(op, medians.get("memcpy")),
    )


def _rates(results: Sequence[CaseResult]) -> tuple[list[float], list[float], list[float]]:
    """Distinct calibrations (one per worker process, to 4 digits): streaming B/s, P_eff
    (element-wise FMA) and the dense (GEMM) rate, each from its fastest call."""
    bandwidth, compute, dense = set(), set(), set()
    for r in results:
        for t in r.timings:
            if t.scope == "memcpy" and t.floor_s and t.bytes_moved:
                bandwidth.add(float(f"{t.bytes_moved / t.floor_s:.4g}"))
            elif t.scope in _RATES and t.flops and t.min_s > 0:
                rate = float(f"{t.flops / t.min_s:.4g}")  # as calibrate.rates_of
                (compute if t.scope == "fma" else dense).add(rate)
    return sorted(bandwidth), sorted(compute), sorted(dense)


def _slope(xs: Sequence[float], ys: Sequence[float], log: bool) -> float | None:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    if log:
        pts = [(math.log(x), math.log(y)) for x, y in pts]
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return None if sxx == 0 else sum((x - mx) * (y - my) for x, y in pts) / sxx


def _sweep_key(result: CaseResult) -> tuple[Any, ...]:
    data = result.case.canonical()
    data.pop("seqlen", None)
    return tuple(sorted((k, str(v)) for k, v in data.items()))


def _groups(results: Sequence[CaseResult]) -> list[list[CaseResult]]:
    """Timed forward cases grouped by everything but seqlen; groups of 3+ lengths."""
    groups: dict[tuple[Any, ...], list[CaseResult]] = defaultdict(list)
    for r in results:
        if r.timings and r.case.seqlen is not None:
            groups[_sweep_key(r)].append(r)
    out = [sorted(g, key=lambda r: r.case.seqlen or 0) for g in groups.values()]
    return [g for g in out if len({r.case.seqlen for r in g}) >= 3]


def _series(group: list[CaseResult], scopes: Sequence[str], x_of: Any, log: bool) -> list:
    series = []
    for scope in scopes:
        pts = [(x_of(r, t), t.median_s) for r in group for t in r.timings if t.scope == scope]
        if len(pts) >= 2:
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            s = SweepSeries(scope, xs, ys)
            fit = _slope(xs, ys, log)
            if log:
                s.slope = fit
            else:
                s.per_tile_s = fit
            series.append(s)
    return series


def _charts(results: Sequence[CaseResult], tile: int | None) -> list[SweepChart]:
    charts = []
    for group in _groups(results):
        case = group[0].case
        label = f"{case.suite}: {case.op} K{case.width} C{case.dim} B{case.batch} {case.x_dtype}"
        series = _series(group, _BYTES_SCOPES, lambda r, t: _bytes(r), log=True)
        if series:
            xs = sorted({x for s in series for x in s.x})
            charts.append(SweepChart("bytes", f"{label}: time vs bytes", "bytes moved", xs,
                                     series))  # fmt: skip
        if case.op != "fwd_bwd":
            continue
        series = _series(group, _TILE_SCOPES, lambda r, t: _tiles(r, tile), log=False)
        if series:
            xs = sorted({x for s in series for x in s.x})
            what = f"tiles (T={tile})" if tile else "length (no tile)"
            charts.append(SweepChart("tiles", f"{label}: backward time vs {what}", what, xs,
                                     series))  # fmt: skip
    return charts


def _tiles(result: CaseResult, tile: int | None) -> float:
    """ceil(L / tile), or L when no tile is declared."""
    return float(-(-(result.case.seqlen or 0) // (tile or 1)))


def _bytes(result: CaseResult) -> float:
    """The conv's D of a case (its memcpy row moved exactly that)."""
    copy = next((t for t in result.timings if t.scope == "memcpy"), None)
    if copy is not None and copy.bytes_moved:
        return copy.bytes_moved
    return next((t.bytes_moved or 0.0 for t in result.timings if t.scope == "op"), 0.0)


def build_performance_section(
    results: Sequence[CaseResult], geometry: Mapping[str, Any] | None = None
) -> PerformanceSection | None:
    """The summary of a run's timings, or None when nothing was timed."""
    timed = [r for r in results if r.timings]
    if not timed:
        return None
    bandwidth, compute, dense = _rates(timed)
    seen = {c for r in timed for c in map(_column, r.timings) if c is not None}
    order = {s: i for i, s in enumerate(_ORDER)}
    scopes = sorted(seen, key=lambda k: (order.get(k.split("[")[0], 99), k))
    tile = (geometry or {}).get("tile")
    return PerformanceSection(
        bandwidth=bandwidth,
        compute=compute,
        dense=dense,
        scopes=scopes,
        rows=sorted((_row(r) for r in timed), key=lambda row: (row.suite, row.name)),
        charts=_charts(timed, int(tile) if tile else None),
    )
