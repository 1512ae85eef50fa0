"""``convmatrix expand MATRIX [--kernel SPEC] [--format table|jsonl] [--coverage]``.

Shows the cases a matrix yields for a kernel (symbols such as ``tile+1`` resolve against the
kernel's declared geometry), how many each suite's strategy produced, and with ``--coverage``
whether every declared value, every pair of dimensions and every row of docs/spec.md §3 is hit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any, TextIO

from convmatrix.core.errors import UsageError
from convmatrix.matrix import Coverage, Expansion, coverage, expand_matrix, load_matrix

__all__ = ["add_arguments", "expand_command", "render_coverage", "render_table"]


def render_table(expansion: Expansion, out: TextIO) -> None:
    spec = expansion.matrix
    geometry = ", ".join(f"{k}={v}" for k, v in sorted(expansion.geometry.items())) or "none"
    print(
        f"matrix {spec.name} ({spec.path}), kernel {expansion.kernel or '-'}, geometry {geometry}",
        file=out,
    )
    for suite in expansion.suites:
        s = suite.suite
        errors = sum(1 for c in suite.cases if c.expect == "error")
        print(
            f"suite {s.name} [{s.op}]: {suite.strategy} -> {len(suite.rows)} combinations"
            f" + {len(s.includes)} included = {len(suite.cases)} cases"
            f" ({errors} expected errors; cartesian product {s.cartesian_size:,})",
            file=out,
        )
    for note in expansion.notes:
        print(f"dropped for this kernel's geometry: {note}", file=out)
    print(file=out)
    width = max((len(c.pytest_id) for c in expansion.cases), default=0)
    for case in expansion.cases:
        note = f"  error: {case.expect_reason}" if case.expect_reason else ""
        note = note or ("  error (matrix)" if case.expect == "error" else "")
        print(f"{case.id}  {case.pytest_id:<{width}}{note}".rstrip(), file=out)
    print(f"\n{len(expansion.cases)} cases", file=out)


def render_coverage(cov: Coverage, out: TextIO) -> None:
    print("docs/spec.md §3 rows:", file=out)
    for item in cov.spec:
        mark = "n/a " if not item.applicable else ("ok  " if item.covered else "MISS")
        print(f"  {mark} {item.row:<12} {item.value:<36} {item.cases:>5} cases", file=out)
    print("\ndimension values:", file=out)
    for v in cov.values:
        mark = "ok  " if v.covered else "MISS"
        print(f"  {mark} {v.suite}.{v.dim} = {v.value:<28} {v.cases:>5} cases", file=out)
    print("\npairs of dimensions:", file=out)
    for p in cov.pairs:
        mark = "ok  " if p.complete else "MISS"
        missing = "" if p.complete else "  missing: " + ", ".join(f"{a}/{b}" for a, b in p.missing)
        print(
            f"  {mark} {p.suite}: {p.dims[0]} x {p.dims[1]}: {p.covered}/{p.valid}{missing}",
            file=out,
        )
    verdict = "complete" if cov.complete else "INCOMPLETE"
    print(
        f"\ncoverage {verdict}: {sum(i.covered for i in cov.spec)}/{len(cov.spec)} SPEC "
        f"values, {sum(p.complete for p in cov.pairs)}/{len(cov.pairs)} dimension pairs",
        file=out,
    )


def _record(kind: str, item: Any, *derived: str) -> str:
    """One coverage item as a JSON line: its fields plus the named derived properties."""
    return json.dumps({"kind": kind, **asdict(item), **{d: getattr(item, d) for d in derived}})


def _coverage_jsonl(cov: Coverage, out: TextIO) -> None:
    for item in cov.spec:
        print(_record("spec", item, "covered"), file=out)
    for v in cov.values:
        print(_record("value", v, "covered"), file=out)
    for p in cov.pairs:
        print(_record("pair", p, "complete"), file=out)


def expand_command(
    matrix: str,
    kernel: str | None = None,
    fmt: str = "table",
    show_coverage: bool = False,
    out: TextIO | None = None,
    max_cases: int | None = None,
) -> int:
    """Print the expansion (or its coverage); 0 on success, UsageError (2) on bad input
    (a matrix of more cases than ``max_cases``, the matrix's or the default limit included)."""
    if max_cases is not None and max_cases < 1:
        raise UsageError(f"--max-cases {max_cases}: give a number of cases >= 1")
    out = out or sys.stdout
    spec = load_matrix(matrix)
    kernel_obj = None
    if kernel is not None:
        from convmatrix.kernels import KernelSpecError, load

        try:
            kernel_obj = load(kernel)
        except KernelSpecError as exc:
            raise UsageError(f"--kernel {kernel}: {exc}") from None
    expansion = expand_matrix(spec, kernel_obj, max_cases)
    try:
        _write(expansion, fmt, show_coverage, out)
    except BrokenPipeError:  # `convmatrix expand nightly | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
    return 0


def _write(expansion: Expansion, fmt: str, show_coverage: bool, out: TextIO) -> None:
    if show_coverage:
        cov = coverage(expansion)
        (_coverage_jsonl if fmt == "jsonl" else render_coverage)(cov, out)
    elif fmt == "jsonl":
        for case in expansion.cases:
            print(json.dumps({**case.to_json(), "pytest_id": case.pytest_id}), file=out)
    else:
        render_table(expansion, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[2] if __doc__ else None
    parser.add_argument("matrix", metavar="MATRIX", help="built-in matrix name or a YAML path")
    parser.add_argument(
        "--kernel", metavar="SPEC", help="registered kernel name or package.module:attribute"
    )
    parser.add_argument("--format", choices=("table", "jsonl"), default="table", dest="fmt")
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="print which values, pairs and docs/spec.md §3 rows are covered instead of the cases",
    )
    parser.add_argument(
        "--max-cases",
        type=int,
        metavar="N",
        help="refuse a matrix that can expand to more than N cases, counted before expanding "
        "(default: the matrix's max_cases, else 100000)",
    )
    parser.set_defaults(
        handler=lambda a: expand_command(
            a.matrix, a.kernel, a.fmt, a.coverage, max_cases=a.max_cases
        )
    )
