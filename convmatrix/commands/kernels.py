"""``convmatrix kernels [--seeded]``: every registered kernel and whether it can run here;
``--seeded`` adds the seeded-bug kernels (``seeded:NAME``, docs/adequacy.md) with their bug
class, the docs/spec.md §3 dimension meant to catch each, and where the bug comes from."""

from __future__ import annotations

import argparse

from convmatrix.kernels.interface.registry import list_kernels


def list_kernels_command(seeded: bool = False) -> int:
    infos = list_kernels(seeded=seeded)
    width = max(len(i.name) for i in infos)
    for info in infos:
        print(f"{info.name:<{width}}  {info.status}  ({info.target})")
    if seeded:
        from convmatrix.kernels.doubles.seeded import CATALOGUE, SIZE_CATALOGUE

        for title, catalogue in (("seeded bugs", CATALOGUE), ("size bugs", SIZE_CATALOGUE)):
            print(f"\n{len(catalogue)} {title}:")
            for name, cls in catalogue.items():
                bug = cls.bug
                where = f"  {bug.threshold}" if bug.threshold else ""
                line = f"  {name:<{width}}  {bug.dimension:<11}  {bug.bug_class}"
                print(f"{line}  [{bug.source}]{where}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeded", action="store_true", help="also list the seeded-bug kernels (seeded:NAME)"
    )
    parser.set_defaults(handler=lambda args: list_kernels_command(args.seeded))
