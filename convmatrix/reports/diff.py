"""The diff report: two runs (two kernel commits) compared (``convmatrix.compare``), with the
headers a person reads them by, and its text for a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from convmatrix.compare.errors import Declared
from convmatrix.compare.runs import DiffOptions, RunComparison, compare_runs
from convmatrix.compare.timing.history import HistoryRule, TimingHistory, history_regressions
from convmatrix.core.records import CaseResult
from convmatrix.reports.source import LoadedRun, earlier_runs, load_run, previous_run
from convmatrix.reports.viewmodel import RunHeader, shard_lines

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = ["DiffView", "build_diff", "diff_runs", "diff_text"]


@dataclass
class DiffView(RunComparison):
    """A comparison with the runs' headers: what the diff page and its JSON show."""

    kind: str = "diff"
    base: RunHeader | None = None
    head: RunHeader | None = None


def build_diff(
    base: RunHeader,
    base_results: Sequence[CaseResult],
    head: RunHeader,
    head_results: Sequence[CaseResult],
    options: DiffOptions | None = None,
) -> DiffView:
    """``compare_runs`` of the two runs, shown under their headers (which say what arithmetic
    each kernel declared: the usage compares only under one)."""
    declared = (Declared.of(base.arithmetic), Declared.of(head.arithmetic))
    compared = compare_runs(base_results, head_results, options, declared=declared)
    sections = {f.name: getattr(compared, f.name) for f in fields(RunComparison)}
    return DiffView(**sections, base=base, head=head)


def _timing_history(session: Reader, head: LoadedRun, rule: HistoryRule, url: str) -> TimingHistory:
    """HEAD's timings against the runs of its kernel, matrix and device before it."""
    lineage = list(reversed(earlier_runs(session, head.info, rule.window + rule.confirm - 1)))
    runs = [(r.id, {x.case.id: x.timings for x in load_run(session, str(r.id), url).results})
            for r in lineage]  # fmt: skip
    runs.append((head.info.id, {x.case.id: x.timings for x in head.results}))
    return history_regressions(runs, {x.case.id: x.case.pytest_id for x in head.results}, rule)


def diff_runs(
    session: Reader,
    url: str,
    base: str | None,
    head: str,
    options: DiffOptions | None = None,
    history: HistoryRule | None = None,
) -> DiffView | None:
    """The diff of two runs; ``base=None`` means the previous run of HEAD's kernel (``None``
    is returned when there is none). With ``history``, HEAD's timings are also judged against
    the runs of its lineage (``timing_history``)."""
    new = load_run(session, head, url, what="HEAD")
    if base is None:
        prev = previous_run(session, new.info)
        if prev is None:
            return None
        base = str(prev.id)
    old = load_run(session, base, url, what="BASE")
    judged = None if history is None else _timing_history(session, new, history, url)
    view = build_diff(old.header, old.results, new.header, new.results, options)
    view.timing_history = judged
    return view


def _rule(view: DiffView) -> str:
    """The error rule the comparison used, in a few words."""
    options = view.options
    floors = "".join(f", {d} {f:g}" for d, f in options.get("floors", {}).items())
    return (
        f"bound usage x{options['factor']:g} above {options['floor']:g}{floors}; "
        f"e_rel/e_norm x{options['fallback_factor']:g} where usage cannot judge"
    )


def _more(view: DiffView, shown: int, total: int, what: str) -> list[str]:
    """The line that says how many entries of a section were left out, and where they are."""
    if total <= shown:
        return []
    base, head = view.base.id if view.base else "BASE", view.head.id if view.head else "HEAD"
    return [
        f"  ... and {total - shown} more {what}: see the diff report "
        f"(convmatrix diff {base} {head} --out diff.html)"
    ]


def diff_text(view: DiffView, limit: int = 10) -> str:
    """The text summary printed on stdout: counts per section and the first ``limit`` entries
    of each, then how many more there are and where to see them all."""
    lines = [
        f"diff {view.base.title} -> {view.head.title}",
        f"  cases: {view.n_common} in both, {len(view.added)} added, {len(view.removed)} removed",
        f"  new failures: {len(view.new_failures)}  fixed: {len(view.fixed)}  "
        f"still failing: {len(view.still_failing)}  newly skipped: {len(view.newly_skipped)}",
        f"  error regressions: {len(view.error_regressions)}  "
        f"error improvements: {len(view.error_improvements)}  ({_rule(view)})",
        f"  timing regressions: {len(view.timing.regressions)}  "
        f"improvements: {len(view.timing.improvements)}  "
        f"not enough samples: {len(view.timing.not_enough_samples)}",
    ]
    for side, run in (("BASE", view.base), ("HEAD", view.head)):
        lines += [f"  {side} {line}" for line in shard_lines(run)]
    for c in view.new_failures[:limit]:
        was = c.base_outcome or "not in base"
        lines.append(f"  NEW FAILURE  {c.name} ({was} -> {c.head_outcome})")
    lines += _more(view, limit, len(view.new_failures), "new failures")
    for e in view.error_regressions[:limit]:
        lines.append(f"  REGRESSION   {e.name} {e.output}: {e.text()}")
    lines += _more(view, limit, len(view.error_regressions), "error regressions")
    if view.timing.drift is not None:
        drift = view.timing.drift
        lines.append(f"  machine drift (framework path, median over cases): x{drift:.3f}")
    pooled = view.timing.pooled
    if pooled is not None and pooled.ratio is not None:
        verdict = "SLOWER" if pooled.slower else "FASTER" if pooled.faster else "no change"
        lines.append(
            f"  kernel as a whole: x{pooled.ratio:.3f} over {pooled.n_cases} cases "
            f"(signed-rank p={pooled.p_slower:.2g} slower, {pooled.p_faster:.2g} faster): "
            f"{verdict}; a lone timing must move beyond x{pooled.noise:.2f} (run-to-run noise), "
            f"{len(view.timing.within_noise)} within it"
        )
    for t in view.timing.regressions[:limit]:
        corrected = f", x{t.corrected_ratio:.2f} vs framework" if t.corrected_ratio else ""
        lines.append(
            f"  SLOWER       {t.name} [{t.scope}{'/' + t.mode if t.mode else ''}] "
            f"x{t.ratio:.2f} (p={t.p_value:.2g}{corrected})"
        )
    lines += _more(view, limit, len(view.timing.regressions), "timing regressions")
    history = view.timing_history
    if history is not None:
        lines.append(
            f"  timing history: {len(history.regressions)} regressions of {history.judged} "
            f"timings (baseline runs {history.baseline_runs}, confirmed by {history.recent_runs})"
        )
        for c in history.regressions[:limit]:
            mode = "/" + c.mode if c.mode else ""
            lines.append(f"  SLOWER SINCE {c.name} [{c.scope}{mode}] x{c.ratio:.2f}")
        lines += _more(view, limit, len(history.regressions), "timing regressions since")
    if view.empty:
        lines.append("  no changes")
    return "\n".join(lines)
