"""What a CI job shows of a run: JUnit XML (one testcase per case) and a markdown summary.

The summary goes where GitHub Actions reads it (``$GITHUB_STEP_SUMMARY``), which takes at most
1 MiB per step: it is written within ``SUMMARY_LIMIT`` bytes, lists cut with a line saying how
many were left out. It names only the regressions the run's scan inserted (the new ones), with
the outcome counts and, when a base URL is configured, links to the served pages.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from convmatrix.core.records import BAD_OUTCOMES, OUTCOMES, CaseResult
from convmatrix.core.verdict import describe
from convmatrix.service.regressions import Regression, ScanResult

__all__ = ["SUMMARY_LIMIT", "job_summary_markdown", "junit_xml", "write_junit"]

SUMMARY_LIMIT = 1024 * 1024 - 16 * 1024  # GitHub's 1 MiB, less room for other steps' lines


def junit_xml(run_name: str, results: Sequence[CaseResult]) -> bytes:
    """One ``testsuite`` with a ``testcase`` per case: failed and bad outcomes are failures
    (crashed, timeout and error as ``error``) whose text is the verdict's; skips skipped."""
    suite = ET.Element("testsuite", name=run_name, tests=str(len(results)))
    counts = dict.fromkeys(("failures", "errors", "skipped"), 0)
    total_s = 0.0
    for result in results:
        case = result.case
        total_s += result.duration_s
        element = ET.SubElement(
            suite, "testcase", classname=f"convmatrix.{case.suite}", name=case.pytest_id,
            time=f"{result.duration_s:.3f}", id=case.id,
        )  # fmt: skip
        text = "\n".join(describe(result))
        if result.outcome == "failed":
            counts["failures"] += 1
            child = ET.SubElement(element, "failure", message=(result.message or "failed")[:500])
            child.text = text
        elif result.outcome in BAD_OUTCOMES:
            counts["errors"] += 1
            message = (result.message or result.outcome)[:500]
            child = ET.SubElement(element, "error", message=message, type=result.outcome)
            child.text = text
        elif result.outcome == "skipped":
            counts["skipped"] += 1
            ET.SubElement(element, "skipped", message=result.message or "skipped")
    for name, n in counts.items():
        suite.set(name, str(n))
    suite.set("time", f"{total_s:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(path: Path, run_name: str, results: Sequence[CaseResult]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(junit_xml(run_name, results))
    return path


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(base_url: str | None, path: str, text: str) -> str:
    return f"[{text}]({base_url.rstrip('/')}{path})" if base_url else text


def _regression_rows(regs: Sequence[Regression], base_url: str | None) -> list[str]:
    return [
        f"| {_link(base_url, f'/cases/{r.case_id}', r.case_id)} | {_cell(r.case_name)} | "
        f"{r.kind.replace('_', ' ')} | {r.output or ''} | {_cell(r.detail or '')} |"
        for r in regs
    ]


def job_summary_markdown(
    run_id: int,
    title: str,
    counts: dict[str, int],
    scan: ScanResult | None,
    *,
    base_url: str | None = None,
    limit: int = SUMMARY_LIMIT,
) -> str:
    """The markdown summary of run ``run_id``, at most ``limit`` bytes in UTF-8."""
    bad = sum(counts.get(o, 0) for o in BAD_OUTCOMES)
    head = [
        f"## convmatrix: {_link(base_url, f'/runs/{run_id}', title)} "
        f"{'FAILED' if bad else 'PASSED'}",
        "",
        "| " + " | ".join(OUTCOMES) + " |",
        "|" + "---|" * len(OUTCOMES),
        "| " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES) + " |",
        "",
    ]
    if scan is None:
        head.append("Not recorded: no regressions were looked for.")
        return "\n".join(head) + "\n"
    if scan.baseline_id is None:
        head.append("No earlier run of this kernel, matrix and device: every failure is new.")
    else:
        diff = _link(base_url, f"/diff/{scan.baseline_id}/{run_id}", f"run {scan.baseline_id}")
        head.append(f"Compared with {diff}.")
    head += [
        "",
        f"**{len(scan.new)} new regressions**, {len(scan.kept)} already known, "
        f"{len(scan.fixed)} fixed by this run"
        + (f" ({_link(base_url, '/regressions', 'all regressions')})." if base_url else "."),
        "",
    ]
    tail: list[str] = []
    for kind, heading in (
        ("new_failure", "New failures"),
        ("error_regression", "Error regressions"),
        ("timing_regression", "Timing regressions"),
    ):
        regs = [r for r in scan.new if r.kind == kind]
        if regs:
            tail += [f"### {heading} ({len(regs)})", "", "| case | name | kind | output | detail |",
                     "|---|---|---|---|---|", *_regression_rows(regs, base_url), ""]  # fmt: skip
    text = "\n".join(head) + "\n"
    budget = limit - len(text.encode()) - 200
    kept: list[str] = []
    for i, line in enumerate(tail):
        size = len(line.encode()) + 1
        if size > budget:
            kept.append(f"\n... {len(tail) - i} more lines left out (summary limit).")
            break
        kept.append(line)
        budget -= size
    return text + "\n".join(kept) + "\n"
