"""``convmatrix kernels``: every registered kernel and whether it can run here."""

from __future__ import annotations

import argparse

from convmatrix.kernels import list_kernels


def list_kernels_command() -> int:
    infos = list_kernels()
    width = max(len(i.name) for i in infos)
    for info in infos:
        print(f"{info.name:<{width}}  {info.status}  ({info.target})")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kernels", help="list registered kernels and their availability")
    parser.set_defaults(handler=lambda args: list_kernels_command())
