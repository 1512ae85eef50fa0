"""``convmatrix cache [clear] [--reference-cache DIR] [--reference-cache-size SIZE]
[--matrix M [--kernel K]]``: the reference cache a run reads and writes.

Shows where it is, what it holds against its limit and its counters (hits, misses, entries
that failed their check, writes that failed, evictions, cases left out); with ``--matrix``,
what that matrix's references would take and which of them a run would keep. ``clear``
removes its entries and counters (nothing else: ``runners.case.refcache.directory``). Never
imports torch: the directory is read as files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from convmatrix.core.case import Case
from convmatrix.core.errors import UsageError
from convmatrix.runners.case.refcache.directory import (
    CACHE_ENV,
    CacheDir,
    cache_directory,
    default_directory,
)
from convmatrix.runners.case.refcache.footprint import admit, human_bytes
from convmatrix.runners.options import parse_size

__all__ = ["add_arguments", "cache_command", "clear_command"]

_DEFAULT_SIZE = "8G"  # DEFAULT_LIMIT_BYTES, as run's --reference-cache-size spells it


def _where(spec: str | None) -> tuple[str | None, str]:
    """(directory or None when off, how it was chosen)."""
    if spec:
        how = "--reference-cache"
    elif os.environ.get(CACHE_ENV):
        how = f"${CACHE_ENV}"
    else:
        how = "the default"
    return cache_directory(spec), how


def _planned(matrix: str, kernel: str | None) -> list[Case]:
    """The cases of ``matrix`` a run with ``kernel`` would compute a reference for."""
    from convmatrix.matrix import expand_matrix, load_matrix

    kernel_obj = None
    if kernel is not None:
        from convmatrix.kernels import KernelSpecError, load

        try:
            kernel_obj = load(kernel)
        except KernelSpecError as exc:
            raise UsageError(f"--kernel {kernel}: {exc}") from None
    cases = expand_matrix(load_matrix(matrix), kernel_obj).cases
    if kernel_obj is not None:
        cases = [c for c in cases if not kernel_obj.capabilities.missing_features(c)]
    return [c for c in cases if c.expect != "error"]


def cache_command(
    spec: str | None = None, size: str = _DEFAULT_SIZE, matrix: str | None = None,
    kernel: str | None = None,
) -> int:  # fmt: skip
    """Print the cache's location, size against its limit, entries and counters."""
    root, how = _where(spec)
    limit = parse_size(size)
    if root is None:
        print(f"reference cache: off ({how})")
        return 0
    directory = CacheDir(Path(root), limit)
    used, entries = directory.usage()
    stats = directory.stats()
    print(f"location  {root}  ({how}; --reference-cache off or {CACHE_ENV}=off turns it off)")
    print(f"size      {human_bytes(used)} in {entries} entries, limit {human_bytes(limit)} "
          f"(--reference-cache-size, default {_DEFAULT_SIZE})")  # fmt: skip
    print(f"reads     {stats['hit']} hits, {stats['miss']} misses, {stats['damaged']} failed "
          f"their check (recomputed), {stats['skipped']} cases left out")  # fmt: skip
    print(f"writes    {stats['stored']} stored, {stats['write_failed']} failed, "
          f"{stats['evicted']} evicted")  # fmt: skip
    if matrix is not None:
        admission = admit(_planned(matrix, kernel), limit)
        print(f"{matrix}  {admission.cases} cached cases need about "
              f"{human_bytes(admission.planned_bytes)}; a run keeps the "
              f"{len(admission.admitted)} largest that fit "
              f"({human_bytes(admission.admitted_bytes)})")  # fmt: skip
    return 0


def clear_command(spec: str | None = None) -> int:
    """Remove the cache's entries, temporary files and counters."""
    root, how = _where(spec)
    if root is None:
        print(f"reference cache: off ({how}); nothing to clear")
        return 0
    removed, freed = CacheDir(Path(root)).clear()
    print(f"{root}: removed {removed} files ({human_bytes(freed)})")
    return 0


def _location(parser: argparse.ArgumentParser, dest: str = "reference_cache") -> None:
    parser.add_argument(
        "--reference-cache", metavar="DIR|off", dest=dest,
        help=f"the cache directory (default: ${CACHE_ENV}, else {default_directory()})",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show the reference cache a run reads and writes: where it is, its size against its "
        "limit, its entries and its counters; `clear` empties it. On by default for "
        f"`convmatrix run`, in ${CACHE_ENV} or {default_directory()}, limit {_DEFAULT_SIZE}; "
        "`--reference-cache off` turns it off."
    )
    _location(parser)
    parser.add_argument(
        "--reference-cache-size", default=_DEFAULT_SIZE, metavar="SIZE",
        help="the limit to show it against (a run's --reference-cache-size)",
    )  # fmt: skip
    parser.add_argument(
        "--matrix", metavar="M", help="also estimate what this matrix's references would take"
    )
    parser.add_argument("--kernel", metavar="SPEC", help="with --matrix: the kernel of the run")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    clear = actions.add_parser("clear", help="remove every entry and the counters")
    _location(clear, "clear_cache")  # its own dest: a subparser's default would hide the other
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if args.action == "clear":
        return clear_command(args.clear_cache or args.reference_cache)
    return cache_command(args.reference_cache, args.reference_cache_size, args.matrix, args.kernel)
