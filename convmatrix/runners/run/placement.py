"""Binding a worker process to one device: what every executor does before touching a device.

The xdist executor numbers its workers gwN and gives worker N device N mod count; the Ray executor
numbers the device actors of each node. Either way the process gets the visibility variables
of its physical device (``CUDA_VISIBLE_DEVICES`` / ``MLU_VISIBLE_DEVICES``), sees it as device
0, and a CPU worker gets the torch threads and OpenMP wait of the run's thread policy
(``runners.run.threads``: one thread a worker by default; torch's default, every core spinning,
oversubscribes a host that runs several workers or anything else).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from convmatrix.core.devices import backend_module, visible_devices_env
from convmatrix.runners.run.threads import ThreadSetting

__all__ = ["WorkerPlacement", "bind", "place_device", "place_worker"]


@dataclass(frozen=True)
class WorkerPlacement:
    """Where a worker runs: its device, the visibility variables, its torch threads."""

    device: str  # "cpu", "cuda:0", "mlu:0" (torch.device("mlu") needs torch_mlu imported)
    env: dict[str, str]
    threads: int | None  # None: leave torch's default (accelerator workers)
    index: int | None = None  # the physical device index (None on CPU)


def place_device(
    index: int,
    workers: int,
    kind: str,
    cores: int,
    environ: dict | None = None,
    policy: ThreadSetting | None = None,
) -> WorkerPlacement:
    """Device ``index`` of ``kind`` on a host where ``workers`` workers share ``cores``, under
    the run's thread ``policy`` (default: ``auto``)."""
    env = visible_devices_env(kind, index, environ)
    if kind == "cpu":
        policy = policy or ThreadSetting()
        env.update(policy.environment())  # the wait of what the worker starts (case children)
        return WorkerPlacement("cpu", env, policy.threads(max(1, workers), cores))
    return WorkerPlacement(f"{kind}:0", env, None, index)


def place_worker(
    worker_id: str,
    workers: int,
    kind: str,
    count: int,
    cores: int,
    environ: dict | None = None,
    policy: ThreadSetting | None = None,
) -> WorkerPlacement:
    """xdist worker gwN owns device N mod count, which it then sees as device 0."""
    number = int(worker_id.lstrip("gw") or 0)
    return place_device(number % max(1, count), workers, kind, cores, environ, policy)


def bind(where: WorkerPlacement, kind: str) -> torch.device:
    """Apply ``where`` to this process (before anything initialises the device)."""
    os.environ.update(where.env)
    if where.threads is not None:
        torch.set_num_threads(where.threads)
    else:
        backend_module(kind)  # registers torch.mlu (imports torch_mlu) after the pinning
    return torch.device(where.device)
