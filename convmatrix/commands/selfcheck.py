"""``convmatrix selfcheck``: verify the float64 oracle before trusting any comparison."""

from __future__ import annotations

import argparse

from convmatrix.kernels.oracle.selfcheck import run_selfcheck


def selfcheck() -> int:
    """Print each check with its measured error and limit; 1 if any fails."""
    results = run_selfcheck()
    for r in results:
        mark = "ok  " if r.passed else "FAIL"
        print(f"{mark} {r.name:<72} max|diff| = {r.error:.3e}  (limit {r.limit:.0e})")
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=lambda args: selfcheck())
