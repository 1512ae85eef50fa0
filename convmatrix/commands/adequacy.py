"""``convmatrix adequacy --matrix M``: how many seeded bugs M kills, with which cases, how fast.

Runs the base kernel (``tiled`` by default) through M, refuses when it does not pass every
case (a bug "killed" by a case the base fails is no kill), then runs every seeded-bug kernel
of ``convmatrix.kernels.doubles.seeded`` through M: the same runner and the same database, one run
per bug (kernel ``seeded:NAME``, label ``adequacy NAME``). ``-n N`` runs N bugs at once, each
in a process of its own. The kill matrix is printed and written as HTML and JSON beside the
other reports; ``--minimize`` also writes the smallest case set found that kills the same
bugs, as a matrix file with a ``cases:`` list (docs/adequacy.md).

Exit status: 0 every bug killed, 1 some survived, 2 usage errors or a base that fails M.
"""

from __future__ import annotations

import argparse
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

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError

__all__ = ["add_arguments", "adequacy_command"]


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
    from convmatrix.api import run
    from convmatrix.kernels.builtin.tiled import ENV_VAR

    if job.geometry is not None:
        os.environ[ENV_VAR] = job.geometry
    with contextlib.redirect_stdout(io.StringIO()):
        summary = run(
            job.matrix,
            job.kernel,
            device=job.device,
            workers=0,
            db=job.db,
            label=job.label,
            cases=list(job.cases),
        )
    return _Done(job.kernel, summary.run_id, summary.passed, dict(summary.counts))


def _run_all(jobs: Sequence[_Job], workers: int) -> list[_Done]:
    if workers <= 1 or len(jobs) == 1:
        return [_run_job(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_run_job, jobs))


def _bug_names(spec: str | None) -> list[str]:
    from convmatrix.kernels.doubles.seeded import CATALOGUE
    from convmatrix.matrix.errors import did_you_mean

    if not spec:
        return list(CATALOGUE)
    names = [n.strip().removeprefix("seeded:") for n in spec.split(",") if n.strip()]
    for name in names:
        if name not in CATALOGUE:
            raise UsageError(f"--bugs: unknown seeded bug {name!r}{did_you_mean(name, CATALOGUE)}")
    return list(dict.fromkeys(names))


def _base_geometry(base: str) -> str | None:
    """The base's geometry as ``CONVMATRIX_TILED_GEOMETRY`` text (None: the default one); the
    seeded kernels are ``tiled`` variants, so the base must be a ``tiled`` kernel."""
    from convmatrix.kernels.builtin.tiled import DEFAULT_GEOMETRY, TiledKernel
    from convmatrix.kernels.doubles.seeded import SeededKernel
    from convmatrix.kernels.interface.registry import load

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
    from convmatrix.kernels.interface.registry import load
    from convmatrix.matrix import expand_matrix, load_matrix

    if sample < 1:
        raise UsageError(f"--sample {sample}: give a positive number of cases")
    ids = [c.id for c in expand_matrix(load_matrix(matrix), load(base)).cases]
    picked = set(random.Random(0).sample(ids, min(sample, len(ids))))
    return tuple(i for i in ids if i in picked)


def adequacy_command(args: argparse.Namespace) -> int:
    from convmatrix.api import worker_count
    from convmatrix.db import default_url
    from convmatrix.matrix import load_matrix

    if not args.matrix:
        raise UsageError("--matrix is required")
    spec = load_matrix(args.matrix)
    names = _bug_names(args.bugs)
    geometry = _base_geometry(args.base)
    cases = _sample_ids(args.matrix, args.base, args.sample)
    db = args.db or default_url()
    workers = max(1, worker_count(args.workers, args.device))
    start = time.perf_counter()

    def job(kernel: str, label: str) -> _Job:
        return _Job(args.matrix, kernel, db, label, cases, args.device, geometry)

    base = _run_job(job(args.base, f"adequacy base {args.base}"))
    if not base.passed:
        bad = ", ".join(f"{n} {o}" for o, n in base.counts.items() if n and o != "passed")
        raise UsageError(
            f"base kernel {args.base!r} does not pass matrix {spec.name} ({bad}; run "
            f"{base.run_id}): a bug killed by a case the base fails is no kill; fix the base "
            "or the matrix first"
        )
    done = _run_all([job(f"seeded:{n}", f"adequacy {n}") for n in names], workers)
    seconds = time.perf_counter() - start
    view = _build_view(spec.name, args.base, base, dict(zip(names, done, strict=True)), db, seconds)
    view.sample = args.sample
    if args.minimize is not None:
        _write_minimized(view, spec, args.minimize or args.out / f"{spec.name}-min.yaml")
    from convmatrix.reports.render import write_report

    html, _ = write_report(view, args.out / f"adequacy-{spec.name}.html")
    for line in _lines(view):
        print(line)
    print(f"report: {html}")
    return 0 if view.killed == view.total else 1


def _build_view(matrix: str, base: str, base_done: _Done, done: dict, db: str, seconds: float):  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    from convmatrix.db import load_results, open_database
    from convmatrix.db.engine import redact_url
    from convmatrix.kernels.doubles.seeded import CATALOGUE
    from convmatrix.reports.adequacy import BugInfo, build_adequacy_view

    engine = open_database(db)
    try:
        with Session(engine) as session:
            base_results = load_results(session, base_done.run_id)
            bug_results = {
                name: (d.run_id, load_results(session, d.run_id)) for name, d in done.items()
            }
    finally:
        engine.dispose()
    order = {c.case.id: i for i, c in enumerate(base_results)}
    base_results.sort(key=lambda r: order[r.case.id])
    infos = {}
    for name in done:
        bug = CATALOGUE[name].bug
        infos[name] = BugInfo(name, bug.bug_class, bug.dimension, bug.source, bug.reach)
    return build_adequacy_view(
        matrix=matrix,
        base=base,
        base_run_id=base_done.run_id,
        database=redact_url(db),
        base_results=base_results,
        bug_results=bug_results,
        bugs=infos,
        seconds=seconds,
    )


def _write_minimized(view, spec, path: Path) -> None:  # type: ignore[no-untyped-def]
    from convmatrix.matrix.subset import with_cases
    from convmatrix.reports.adequacy import MinimizedSet, minimize

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


def _lines(view) -> list[str]:  # type: ignore[no-untyped-def]
    lines = [f"{'bug':<30} {'verdict':<9} {'kills':>5} {'first(s)':>8}  caught through"]
    for b in view.bugs:
        first = "-" if b.first_kill_s is None else f"{b.first_kill_s:.2f}"
        verdict = "killed" if b.killed else "SURVIVED"
        lines.append(f"{b.name:<30} {verdict:<9} {len(b.kills):>5} {first:>8}  {', '.join(b.how)}")
    for b in view.survivors:
        lines.append(f"survivor {b.name} (meant for {b.dimension}): add cases with {b.reach}")
    lines.append(
        f"mutation score {view.killed}/{view.total} = {100 * view.score:.1f}% on matrix "
        f"{view.matrix} ({len(view.cases)} cases) in {view.seconds:.1f} s"
    )
    mz = view.minimized
    if mz is not None:
        lines.append(
            f"minimized: {mz.cases} of {mz.of_cases} cases kill the same {view.killed} bugs; "
            f"{mz.seconds:.2f} s of {mz.of_seconds:.2f} s base-kernel time -> {mz.path}"
        )
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run every seeded-bug kernel (tiled with one realistic bug each) through a matrix and "
        "report which cases kill which bug: the kill matrix, the mutation score, survivors, "
        "and with --minimize the smallest case set that kills the same bugs. Exit 0 when "
        "every bug is killed, 1 when some survive, 2 on usage errors or a failing base."
    )
    p.add_argument("--matrix", help="built-in matrix name or a file")
    p.add_argument("--base", default="tiled", help="the correct tiled kernel (default: tiled)")
    p.add_argument("--bugs", metavar="NAME,...", help="only these seeded bugs (default: all)")
    p.add_argument("-n", dest="workers", default="auto", help="bugs run at once: N or auto")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mlu")
    add_db_argument(p)
    p.add_argument(
        "--out", type=Path, default=Path("reports"), metavar="DIR",
        help="directory for adequacy-<matrix>.html/.json (default: reports)",
    )  # fmt: skip
    p.add_argument(
        "--minimize", nargs="?", const="", default=None, metavar="PATH",
        help="write the smallest killing case set as a matrix (default DIR/<matrix>-min.yaml)",
    )  # fmt: skip
    p.add_argument("--sample", type=int, metavar="N", help="run N cases drawn from the matrix")
    p.set_defaults(handler=adequacy_command)
