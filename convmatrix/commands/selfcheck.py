"""``convmatrix selfcheck``: verify the float64 oracle before trusting any comparison."""

from __future__ import annotations

import argparse


def selfcheck(device: str | None = None) -> int:
    """Print each check with its measured error and limit; 1 if any fails."""
    # Imported here: building the parser (``--help``, the docs' CLI reference) needs no torch.
    from convmatrix.kernels.oracle.selfcheck import run_selfcheck

    if device is not None:
        from convmatrix.core.devices import resolve_device

        device = str(resolve_device(device))  # a device that is not here: a usage error
    results = run_selfcheck(device)
    for r in results:
        mark = "ok  " if r.passed else "FAIL"
        print(f"{mark} {r.name:<72} max|diff| = {r.error:.3e}  (limit {r.limit:.0e})")
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check the float64 oracle against a hand-computed example, finite differences, "
        "token-by-token and chunked runs and an independent scalar reference; with --device, "
        "its reference computed there against the host's (bit for bit on a CPU, within 1e-12 "
        "of each element's size on an accelerator). Exit 1 when a check fails."
    )
    parser.add_argument("--device", help="also check the reference on this device (cuda, cpu)")
    parser.set_defaults(handler=lambda args: selfcheck(args.device))
