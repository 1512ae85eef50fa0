"""Measuring a matrix: which seeded bugs its cases kill, with which cases, how fast.

Runs the base kernel (``tiled`` by default) through the matrix, refuses when it does not pass
every case (a bug "killed" by a case the base fails is no kill), then runs every seeded-bug
kernel of ``convmatrix.kernels.doubles.seeded`` through it: the same pipeline and database, one
recorded run per bug (kernel ``seeded:NAME``, label ``adequacy NAME``, not scanned for
regressions), several bugs at once each in a process of its own. ``minimize`` also writes the
smallest case set found that kills the same bugs, as a matrix file with a ``cases:`` list
(docs/adequacy.md). ``convmatrix adequacy`` prints and renders what ``measure`` returns.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from convmatrix.core.errors import UsageError
from convmatrix.db import default_url, load_results
from convmatrix.db.database import Database
from convmatrix.kernels.builtin.tiled import DEFAULT_GEOMETRY, ENV_VAR, TiledKernel
from convmatrix.kernels.doubles.seeded import CATALOGUES, SeededKernel
from convmatrix.kernels.interface.registry import load
from convmatrix.matrix import expand_matrix, load_matrix
from convmatrix.matrix.errors import did_you_mean
from convmatrix.matrix.subset import with_cases
from convmatrix.pipeline.run import run
from convmatrix.reports.adequacy import (
    AdequacyView,
    BugInfo,
    MinimizedSet,
    build_adequacy_view,
    minimize,
)
from convmatrix.runners.options import RunOptions, worker_count

__all__ = ["measure"]


@dataclass(frozen=True)
class _Job:
    matrix: str
    kernel: str
    db: str
    label: str
    cases: tuple[str, ...]
    device: str
    geometry: str | None  # CONVMATRIX_TILED_GEOMETRY for seeded kernels of a non-default base


@dataclass(frozen=True)
class _Done:
    kernel: str
    run_id: int | None
    passed: bool
    counts: dict[str, int]


def _run_job(job: _Job) -> _Done:
    """One run, in this process, its own output swallowed (the kill matrix is the report)."""
    if job.geometry is not None:
        os.environ[ENV_VAR] = job.geometry
    options = RunOptions(
        matrix=job.matrix, kernel=job.kernel, device=job.device, workers=0, db=job.db,
        label=job.label, cases=list(job.cases), kind="adequacy", scan=False,
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        account = run(options).account
    return _Done(job.kernel, account.run_id, account.passed, dict(account.counts))


def _run_all(jobs: Sequence[_Job], workers: int) -> list[_Done]:
    if workers <= 1 or len(jobs) == 1:
        return [_run_job(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_run_job, jobs))


def _bug_names(spec: str | None, catalogue: str = "main") -> list[str]:
    """The bugs ``--bugs`` names (of any catalogue), else every bug of ``--catalogue``."""
    if catalogue not in CATALOGUES:
        raise UsageError(f"--catalogue {catalogue!r}: one of {', '.join(CATALOGUES)}")
    if not spec:
        return list(CATALOGUES[catalogue])
    every = CATALOGUES["all"]
    names = [n.strip().removeprefix("seeded:") for n in spec.split(",") if n.strip()]
    for name in names:
        if name not in every:
            raise UsageError(f"--bugs: unknown seeded bug {name!r}{did_you_mean(name, every)}")
    return list(dict.fromkeys(names))


def _base_geometry(base: str) -> str | None:
    """The base's geometry as ``CONVMATRIX_TILED_GEOMETRY`` text (None: the default one); the
    seeded kernels are ``tiled`` variants, so the base must be a ``tiled`` kernel."""
    kernel = load(base)
    if not isinstance(kernel, TiledKernel) or isinstance(kernel, SeededKernel):
        raise UsageError(
            f"--base {base!r}: the seeded bugs are variants of tiled; give a tiled kernel"
        )
    g = kernel.geometry
    if g == DEFAULT_GEOMETRY:
        return None
    return f"T={g.time_tile},C_t={g.channel_tile},vec={g.vector_width},P={g.partial_groups}"


def _sample_ids(matrix: str, base: str, sample: int | None) -> tuple[str, ...]:
    if sample is None:
        return ()
    if sample < 1:
        raise UsageError(f"--sample {sample}: give a positive number of cases")
    ids = [c.id for c in expand_matrix(load_matrix(matrix), load(base)).cases]
    picked = set(random.Random(0).sample(ids, min(sample, len(ids))))
    return tuple(i for i in ids if i in picked)


def measure(
    matrix: str,
    *,
    base: str = "tiled",
    bugs: str | None = None,
    catalogue: str = "main",
    workers: str | int = "auto",
    device: str = "auto",
    db: str | None = None,
    sample: int | None = None,
    minimize: Path | None = None,
) -> AdequacyView:
    """Run ``base`` and then every seeded bug (``bugs``: names, comma-separated; default
    every bug of ``catalogue``: ``main``, ``size`` (the size bugs) or ``all``) through
    ``matrix``, one recorded run each, ``workers`` bugs at once; the kill matrix.
    ``minimize``: also write the smallest killing case set there as a matrix file."""
    spec = load_matrix(matrix)
    names = _bug_names(bugs, catalogue)
    geometry = _base_geometry(base)
    cases = _sample_ids(matrix, base, sample)
    db = db or default_url()
    parallel = max(1, worker_count(workers, device))
    start = time.perf_counter()

    def job(kernel: str, label: str) -> _Job:
        return _Job(matrix, kernel, db, label, cases, device, geometry)

    base_done = _run_job(job(base, f"adequacy base {base}"))
    if not base_done.passed:
        bad = ", ".join(f"{n} {o}" for o, n in base_done.counts.items() if n and o != "passed")
        raise UsageError(
            f"base kernel {base!r} does not pass matrix {spec.name} ({bad}; run "
            f"{base_done.run_id}): a bug killed by a case the base fails is no kill; fix the base "
            "or the matrix first"
        )
    done = _run_all([job(f"seeded:{n}", f"adequacy {n}") for n in names], parallel)
    seconds = time.perf_counter() - start
    view = _build_view(spec.name, base, base_done, dict(zip(names, done, strict=True)), db, seconds)
    view.sample = sample
    if minimize is not None:
        _write_minimized(view, spec, minimize)
    return view


def _build_view(
    matrix: str, base: str, base_done: _Done, done: dict[str, _Done], db: str, seconds: float
) -> AdequacyView:
    with Database(db) as database, database.reading() as session:
        base_results = load_results(session, base_done.run_id)
        bug_results = {
            name: (d.run_id, load_results(session, d.run_id)) for name, d in done.items()
        }
        shown = database.shown
    order = {c.case.id: i for i, c in enumerate(base_results)}
    base_results.sort(key=lambda r: order[r.case.id])
    infos = {}
    for name in done:
        bug = CATALOGUES["all"][name].bug
        infos[name] = BugInfo(name, bug.bug_class, bug.dimension, bug.source, bug.reach)
    return build_adequacy_view(
        matrix=matrix,
        base=base,
        base_run_id=base_done.run_id,
        database=shown,
        base_results=base_results,
        bug_results=bug_results,
        bugs=infos,
        seconds=seconds,
    )


def _write_minimized(view: AdequacyView, spec: Any, path: Path) -> None:
    ids = minimize(view.cases)
    if not ids:
        raise UsageError(f"--minimize: matrix {spec.name} kills no seeded bug; nothing to keep")
    cost = {c.case_id: c.seconds for c in view.cases}
    comment = (
        f"{spec.name}, minimized by convmatrix adequacy: {len(ids)} of {len(view.cases)} cases\n"
        f"kill the same {view.killed} of {view.total} seeded bugs of {view.base}."
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = Path(spec.path).read_text(encoding="utf-8")
    path.write_text(with_cases(text, f"{spec.name}-min", ids, comment), encoding="utf-8")
    view.minimized = MinimizedSet(
        case_ids=ids,
        cases=len(ids),
        seconds=sum(cost[i] for i in ids),
        of_cases=len(view.cases),
        of_seconds=sum(cost.values()),
        path=str(path),
    )
