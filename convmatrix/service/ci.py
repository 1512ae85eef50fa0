"""What a CI job shows of a run: JUnit XML (one testcase per case) and the job summary.

JUnit: every failing case's ``message`` is its failure in one line (``core.verdict.brief``:
the failing outputs with their usage and what was allowed, the failed properties), its text
the verdict's lines; any character XML cannot hold (a kernel's ANSI colours) is escaped, so a
kernel's words never make the file unreadable.

What a run could not judge is not a pass: a run that judged nothing (the kernel did not load,
too few cases got a verdict: ``runners.run.account``) and a sharded run missing shards each add
an ``error`` testcase of their own (``RunProblem``, classname ``convmatrix.run``), never a
skipped one, and a line at the top of the summary. A shard's outputs hold its own cases only;
the whole run's are ``convmatrix ci-report RUN``'s (``service.ci_report``).

The job summary goes where GitHub Actions reads it (``$GITHUB_STEP_SUMMARY``), which takes at
most 1 MiB per step: it is written within ``SUMMARY_LIMIT`` bytes, every list cut with a line
saying how many were left out and where to see them. It names the regressions this run raised
(new and reopened) with their detail, why they fail (the alert's explanation), and every other
failing case of the run (known failures), each case once, and why cases were skipped (each
reason with its count).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, CaseResult
from convmatrix.core.sanitise import xml_safe
from convmatrix.core.verdict import brief, describe
from convmatrix.service.regressions import Regression

__all__ = [
    "SUMMARY_LIMIT",
    "JobSummary",
    "RunProblem",
    "job_summary_markdown",
    "junit_xml",
    "write_junit",
]

SUMMARY_LIMIT = 1024 * 1024 - 16 * 1024  # GitHub's 1 MiB, less room for other steps' lines


@dataclass(frozen=True)
class RunProblem:
    """Something wrong with the run as a whole, not with one case: ``kind`` is
    ``nothing-judged`` or ``shards-missing``; ``message`` its one line."""

    kind: str
    message: str


def _problem_cases(suite: ET.Element, problems: Sequence[RunProblem]) -> None:
    for problem in problems:
        element = ET.SubElement(suite, "testcase", classname="convmatrix.run", name=problem.kind)
        child = ET.SubElement(element, "error", message=xml_safe(problem.message[:500]))
        child.set("type", problem.kind)
        child.text = xml_safe(problem.message)


def junit_xml(
    run_name: str, results: Sequence[CaseResult], problems: Sequence[RunProblem] = ()
) -> bytes:
    """One ``testsuite`` with a ``testcase`` per case: failed and bad outcomes are failures
    (crashed, timeout and error as ``error``) whose text is the verdict's; skips skipped; and
    one ``error`` testcase per problem of the whole run."""
    tests = len(results) + len(problems)
    suite = ET.Element("testsuite", name=xml_safe(run_name), tests=str(tests))
    counts = dict.fromkeys(("failures", "errors", "skipped"), 0)
    counts["errors"] = len(problems)
    _problem_cases(suite, problems)
    total_s = 0.0
    for result in results:
        case = result.case
        total_s += result.duration_s
        element = ET.SubElement(
            suite, "testcase", classname=f"convmatrix.{case.suite}", name=case.pytest_id,
            time=f"{result.duration_s:.3f}", id=case.id,
        )  # fmt: skip
        text = xml_safe("\n".join(describe(result)))
        message = xml_safe(brief(result, limit=500))
        if result.outcome == "failed":
            counts["failures"] += 1
            child = ET.SubElement(element, "failure", message=message)
            child.text = text
        elif result.outcome in BAD_OUTCOMES:
            counts["errors"] += 1
            child = ET.SubElement(element, "error", message=message, type=result.outcome)
            child.text = text
        elif result.outcome == "skipped":
            counts["skipped"] += 1
            ET.SubElement(element, "skipped", message=xml_safe(result.message or "skipped"))
    for name, n in counts.items():
        suite.set(name, str(n))
    suite.set("time", f"{total_s:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(
    path: Path, run_name: str, results: Sequence[CaseResult], problems: Sequence[RunProblem] = ()
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(junit_xml(run_name, results, problems))
    return path


@dataclass
class JobSummary:
    """What the job summary is written from (the pipeline gathers it after the scan)."""

    run_id: int
    title: str
    counts: dict[str, int]
    results: Sequence[CaseResult]  # the run's, to name its failing cases
    recorded: bool = True  # False: not scanned (a shard of a half run, nothing judged)
    baseline_id: int | None = None
    alert_id: int | None = None
    raised: list[Regression] = field(default_factory=list)  # new and reopened
    known: int = 0  # regressions already open that the run still shows
    fixed: int = 0
    explanation: list[str] = field(default_factory=list)  # why the raised ones fail
    problems: list[RunProblem] = field(default_factory=list)  # nothing judged, shards missing
    skipped: dict[str, int] = field(default_factory=dict)  # skip reason -> cases
    scope: str | None = None  # what part of the run this is (a shard: its own cases only)

    @property
    def headline(self) -> str:
        """PASSED, FAILED, NOTHING JUDGED or INCOMPLETE, in the order exit statuses take."""
        kinds = {p.kind for p in self.problems}
        if any(self.counts.get(o) for o in ("failed", "crashed")):
            return "FAILED"
        if "nothing-judged" in kinds:
            return "NOTHING JUDGED"
        if "shards-missing" in kinds:
            return "INCOMPLETE"
        return "FAILED" if any(self.counts.get(o) for o in BAD_OUTCOMES) else "PASSED"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(base_url: str | None, path: str, text: str) -> str:
    return f"[{text}]({base_url.rstrip('/')}{path})" if base_url else text


def _raised_rows(regs: Sequence[Regression], base_url: str | None) -> list[str]:
    return [
        f"| {_link(base_url, f'/regressions/{r.id}', f'#{r.id}')} | "
        f"{_link(base_url, f'/cases/{r.case_id}', r.case_id)} | {_cell(r.case_name)} | "
        f"{r.kind.replace('_', ' ')} | {_cell(r.detail or '')} |"
        for r in regs
    ]


def _failure_rows(results: Sequence[CaseResult], base_url: str | None) -> list[str]:
    return [
        f"| {_link(base_url, f'/cases/{r.case.id}', r.case.id)} | {_cell(r.case.pytest_id)} | "
        f"{r.outcome} | {_cell(brief(r))} |"
        for r in results
    ]


def job_summary_markdown(
    summary: JobSummary, *, base_url: str | None = None, limit: int = SUMMARY_LIMIT
) -> str:
    """The markdown job summary of one run, at most ``limit`` bytes in UTF-8."""
    run_id, counts = summary.run_id, summary.counts
    head = [
        f"## convmatrix: {_link(base_url, f'/runs/{run_id}', summary.title)} {summary.headline}",
        "",
        *(f"**{_cell(p.message)}**" for p in summary.problems),
        *([""] if summary.problems else []),
        *([summary.scope, ""] if summary.scope else []),
        "| " + " | ".join(OUTCOMES) + " |",
        "|" + "---|" * len(OUTCOMES),
        "| " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES) + " |",
        "",
    ]
    if not summary.recorded:
        head += ["Not scanned: no regressions were looked for.", ""]
    elif summary.baseline_id is None:
        head.append("No earlier run of this kernel, matrix and device: every failure is new.")
    else:
        diff = f"/diff/{summary.baseline_id}/{run_id}"
        head.append(f"Compared with {_link(base_url, diff, f'run {summary.baseline_id}')}.")
    if summary.recorded:
        alert = (
            f" ({_link(base_url, f'/alerts/{summary.alert_id}', f'alert {summary.alert_id}')})"
            if summary.alert_id else ""
        )  # fmt: skip
        head += [
            "",
            f"**{len(summary.raised)} new regressions**{alert}, {summary.known} already "
            f"known, {summary.fixed} fixed by this run.",
            "",
        ]
    head += [f"Where: {_cell(text)}" for text in summary.explanation[:1]]
    tail: list[str] = []
    if summary.raised:
        tail += [f"### New regressions ({len(summary.raised)})", "",
                 "| regression | case | name | kind | detail |", "|---|---|---|---|---|",
                 *_raised_rows(summary.raised, base_url), ""]  # fmt: skip
    named = {r.case_id for r in summary.raised}
    others = [r for r in summary.results if r.outcome in BAD_OUTCOMES and r.case.id not in named]
    if others:
        title = "Other failing cases" if summary.raised else "Failing cases"
        tail += [f"### {title} ({len(others)})", "", "| case | name | outcome | failure |",
                 "|---|---|---|---|", *_failure_rows(others, base_url), ""]  # fmt: skip
    if summary.skipped:
        rows = [f"| {n} | {_cell(why)} |" for why, n in summary.skipped.items()]
        total = sum(summary.skipped.values())
        tail += [f"### Skipped cases ({total})", "", "| cases | why |", "|---|---|", *rows, ""]
    return _within(head, tail, limit, base_url, run_id)


def _within(head: list[str], tail: list[str], limit: int, base_url: str | None, run_id: int) -> str:
    text = "\n".join(head) + "\n"
    budget = limit - len(text.encode()) - 300
    kept: list[str] = []
    for i, line in enumerate(tail):
        size = len(line.encode()) + 1
        if size > budget:
            rows = sum(1 for rest in tail[i:] if rest.startswith("| ") and "---" not in rest)
            where = _link(base_url, f"/runs/{run_id}", f"the report of run {run_id}")
            kept.append(f"\n... {rows} more rows left out (summary limit): see {where}.")
            break
        kept.append(line)
        budget -= size
    return text + "\n".join(kept) + "\n"
