"""``convmatrix kernels``: every registered kernel and whether it can run here."""

from __future__ import annotations

import argparse

from convmatrix.kernels.registry import list_kernels


def list_kernels_command() -> int:
    infos = list_kernels()
    width = max(len(i.name) for i in infos)
    for info in infos:
        print(f"{info.name:<{width}}  {info.status}  ({info.target})")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=lambda args: list_kernels_command())
