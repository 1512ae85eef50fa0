"""``convmatrix devices``: the devices this machine offers and what a run would use.

Prints every device kind (cpu, cuda, mlu) with its devices, versions and visibility variable,
the device ``--device auto`` resolves to here, and how a run behaves on CUDA and MLU machines
(device, per-worker pinning, timers, memory peaks), so the same command explains a CPU box,
a GPU node and an MLU node. ``--format json`` gives the same facts as data.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["add_arguments", "collect", "devices_command", "render"]

# How a run uses each accelerator kind: what the timing and runner layers call on it.
_PLAN = {
    "cuda": "torch.cuda.Event timers, torch.cuda.max_memory_allocated peaks",
    "mlu": "import torch_mlu; torch.mlu.Event timers, torch.mlu.max_memory_allocated peaks",
}


def _devices() -> ModuleType:
    """``core.devices`` imports torch: loaded when a command runs, never to build the parser
    (``--help``, the docs' CLI reference build without torch)."""
    from convmatrix.core import devices

    return devices


def collect() -> dict[str, Any]:
    """The facts as plain data (also what ``--format json`` prints)."""
    devices = _devices()
    built, usable = devices.accelerator()
    backends = []
    for backend in devices.discover_all():
        env = backend.visible_env
        backends.append(
            {
                "kind": backend.kind,
                "available": backend.available,
                "reason": backend.reason,
                "count": backend.count,
                "devices": [
                    {"index": d.index, "name": d.name, "total_memory": d.total_memory}
                    for d in backend.devices
                ],
                "versions": dict(backend.versions),
                "visible_env": env,
                "visible": os.environ.get(env) if env else None,
            }
        )
    return {
        "accelerator": {"built": built, "usable": usable},
        "auto": str(devices.resolve_device("auto")),
        "backends": backends,
    }


def _describe_backend(entry: dict[str, Any]) -> list[str]:
    kind = entry["kind"]
    if not entry["available"]:
        lines = [f"{kind:<5} unavailable: {entry['reason']}"]
    else:
        lines = [f"{kind:<5} available, {entry['count']} device(s)"]
        for dev in entry["devices"]:
            memory = dev["total_memory"]
            size = f", {memory / 2**30:.1f} GiB" if memory else ""
            where = f"{kind}:{dev['index']}" if dev["index"] is not None else kind
            lines.append(f"      {where}  {dev['name']}{size}")
    if entry["versions"]:
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items())
        lines.append(f"      versions: {versions}")
    if entry["visible_env"]:
        shown = entry["visible"] if entry["visible"] is not None else "(unset: all devices)"
        lines.append(f"      {entry['visible_env']}={shown}")
    return lines


def render(facts: dict[str, Any]) -> str:
    acc = facts["accelerator"]
    if acc["built"] is None:
        head = "accelerator: none (this torch build has no accelerator backend)"
    else:
        state = "usable" if acc["usable"] else "built for it, but no device is usable"
        head = f"accelerator: {acc['built']} ({state})"
    lines = [head]
    for entry in facts["backends"]:
        lines.extend(_describe_backend(entry))
    lines.append(f"--device auto uses: {facts['auto']}")
    visible = {entry["kind"]: entry["visible_env"] for entry in facts["backends"]}
    for kind, how in _PLAN.items():
        env = visible[kind]
        article = "an" if kind == "mlu" else "a"
        lines.append(
            f"on {article} {kind.upper()} machine: --device auto uses {kind}:0; worker i of "
            f"-n N is pinned with {env}=<i-th visible id> and sees it as {kind}:0; {how}"
        )
    return "\n".join(lines)


def devices_command(fmt: str = "text") -> int:
    facts = collect()
    print(json.dumps(facts, indent=2) if fmt == "json" else render(facts))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(handler=lambda args: devices_command(args.format))
