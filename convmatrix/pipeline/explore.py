"""``convmatrix explore``: the search of ``search.explore`` on the run's own engines and database.

Every round is written as a matrix of explicit cases (``search.space.matrix_text``) and run
by ``pipeline.run.run``, the whole of ``convmatrix run``: the same executors (xdist or Ray),
runner, verdict and database. Each round is a recorded run of kind ``explore``, labelled
``explore:<kernel>:<seed>:<round>`` and never scanned: like confirm and bisect runs, explore
runs are no baseline, no ``latest`` and no history point, so a search never pollutes the
nightly history. A failure is shrunk by a ``search.probe.Probe`` built from the first
round's matrix (the same tolerances, policy, timeout and memory budget), each candidate run
in the isolated child process the Ray executor uses (a crashing kernel ends no search).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.errors import InfrastructureError
from convmatrix.core.records import BAD_OUTCOMES
from convmatrix.db.database import Database
from convmatrix.db.queries import load_results
from convmatrix.matrix.build import MAX_ELEMENTS
from convmatrix.pipeline.run import run
from convmatrix.runners.controller import load_kernel
from convmatrix.runners.options import RunOptions
from convmatrix.search.explore import (
    ExploreReport,
    ExploreSettings,
    Progress,
    RoundResult,
    explore,
    findings_matrix,
)
from convmatrix.search.probe import signature_of
from convmatrix.search.space import CaseSpace, Drawn, matrix_text

__all__ = ["ExploreOptions", "explore_kernel", "round_matrix_settings"]


@dataclass(frozen=True)
class ExploreOptions:
    """``convmatrix explore``'s options: the kernel and engine as ``run`` takes them, the
    search's budget, and where its findings go (``out``: a matrix file)."""

    kernel: str
    settings: ExploreSettings
    max_elements: int = 1 << 20
    device: str = "auto"
    workers: int | str = "auto"
    executor: str = "xdist"
    address: str | None = None
    db: str | None = None
    out: Path | None = None
    shrink: bool = True


def round_matrix_settings(max_elements: int) -> dict[str, float]:
    """Per-case timeout and memory budget for cases up to ``max_elements``: the defaults
    (120 s, 8 GiB) are a matrix author's for small cases; a 5e7-element fwd_bwd case takes
    minutes on a CPU core and its float64 reference and guards about 200 bytes an element."""
    return {
        "timeout_s": max(120.0, 2e-5 * max_elements),
        "memory_budget_mb": max(8192.0, 200.0 * max_elements / 2**20),
    }


class _Rounds:
    """The round runner: each round a matrix file in ``folder`` and one recorded run."""

    def __init__(self, options: ExploreOptions, database: Database, folder: Path) -> None:
        self.options, self.database, self.folder = options, database, folder
        self.first: Path | None = None

    def __call__(self, number: int, drawn: Sequence[Drawn]) -> RoundResult:
        o = self.options
        name = f"explore-round-{number}"
        path = self.folder / f"{name}.yaml"
        text = matrix_text(
            [(d.op, d.entry) for d in drawn], name,
            description=f"explore --kernel {o.kernel} --seed {o.settings.seed}, round {number}",
            **round_matrix_settings(o.max_elements),
        )  # fmt: skip
        path.write_text(text, encoding="utf-8")
        self.first = self.first or path
        options = RunOptions(
            matrix=str(path), kernel=o.kernel, device=o.device, workers=o.workers,
            db=self.database.url, executor=o.executor, address=o.address,
            label=f"explore:{o.kernel}:{o.settings.seed}:{number}", kind="explore", scan=False,
            reference_cache="off",  # drawn cases hardly repeat: hashing big ones costs
        )  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):  # the progress line is the output
            end = run(options, self.database)
        if end.account.infrastructure:  # the machine or the database, not a finding: exit 3
            raise InfrastructureError(f"explore round {number}: {end.account.infrastructure}")
        run_id = end.account.run_id
        failures: dict[str, str] = {}
        seconds = 0.0
        if run_id is not None:
            with self.database.reading() as session:
                for result in load_results(session, run_id):
                    seconds += result.duration_s
                    if result.outcome in BAD_OUTCOMES:
                        failures[result.case.id] = signature_of(result)
        return RoundResult(run_id, failures, seconds)


def _shrinker(options: ExploreOptions, rounds: _Rounds) -> Callable[[Case], Any]:
    """``shrink(case)`` on a probe made once, on the first call (no failure: no probe)."""
    probe: list[Any] = []  # search.probe.Probe, made on the first failure

    def run_shrink(case: Case) -> Any:
        from convmatrix.search.probe import Probe
        from convmatrix.search.shrink import shrink

        if not probe:
            run_options = RunOptions(
                matrix=str(rounds.first), kernel=options.kernel, device=options.device,
                workers=0, no_db=True,
            )  # fmt: skip
            probe.append(Probe(run_options, isolate=True))
        return shrink(case, probe[0], max_runs=options.settings.shrink_runs)

    run_shrink.probes = probe  # type: ignore[attr-defined]
    return run_shrink


def explore_kernel(
    options: ExploreOptions, on_progress: Callable[[Progress], None] | None = None
) -> ExploreReport:
    """Search ``options.kernel`` within the budget; write the findings' matrix to
    ``options.out`` when there are any. ``ValueError``/``UsageError`` for bad options."""
    if not 1 <= options.max_elements <= MAX_ELEMENTS:
        raise ValueError(f"max_elements must be in [1, {MAX_ELEMENTS}]")
    kernel = load_kernel(options.kernel)
    space = CaseSpace(kernel, options.max_elements)
    with (
        Database(options.db) as database,
        tempfile.TemporaryDirectory(prefix="convmatrix-explore-") as scratch,
    ):
        rounds = _Rounds(options, database, Path(scratch))
        shrink = _shrinker(options, rounds) if options.shrink else None
        try:
            report = explore(
                space, rounds, options.settings, shrink=shrink, on_progress=on_progress
            )
        finally:
            for probe in getattr(shrink, "probes", []):
                probe.close()
    if options.out is not None and report.findings:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        name = options.out.name.split(".")[0] or "explore"
        options.out.write_text(findings_matrix(report, options.kernel, name), encoding="utf-8")
    return report
