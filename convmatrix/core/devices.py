"""The device layer: which of cpu, cuda and mlu this machine has, and how to use them.

Everything device-specific that runners, timing and ``convmatrix devices`` need lives here, so
that a CUDA or MLU machine needs no code changes: discovery (``torch.accelerator`` where torch
>= 2.6 has it, else ``torch.cuda`` / ``torch.mlu`` after ``import torch_mlu``), counts, names
and versions, synchronisation, event timers, peak memory, and the environment that pins one
worker process to one device.

A CUDA build of torch on a machine without a GPU still names cuda as its accelerator
(``current_accelerator()`` answers from the build, not the hardware); discovery therefore
always checks ``is_available()`` and reports such a machine as "cuda: built, no device".
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from convmatrix.core.errors import UsageError

__all__ = [
    "CPU_CLOCKS",
    "CPU_CLOCK_ENV",
    "KINDS",
    "VISIBLE_ENV",
    "Backend",
    "DeviceInfo",
    "Timer",
    "accelerator",
    "backend_module",
    "cpu_clock",
    "cpu_cores",
    "discover",
    "discover_all",
    "resolve_device",
    "synchronize",
    "timer",
    "visible_devices_env",
]

KINDS = ("cpu", "cuda", "mlu")
# The variable that restricts a process to some devices of a kind (per-worker pinning).
VISIBLE_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "mlu": "MLU_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class DeviceInfo:
    kind: str
    index: int | None
    name: str
    total_memory: int | None = None  # bytes


@dataclass(frozen=True)
class Backend:
    """What this machine offers for one device kind; ``reason`` says why it is unusable."""

    kind: str
    available: bool
    reason: str | None = None
    devices: tuple[DeviceInfo, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def visible_env(self) -> str | None:
        return VISIBLE_ENV.get(self.kind)


def _import_torch_mlu() -> tuple[Any | None, str | None]:
    """(torch_mlu module or None, why not). Importing it registers ``torch.mlu``."""
    try:
        return importlib.import_module("torch_mlu"), None
    except Exception as exc:  # ImportError, or a torch_mlu built against another torch
        return None, f"torch_mlu not importable: {type(exc).__name__}: {exc}"


def accelerator() -> tuple[str | None, bool]:
    """(the accelerator kind torch was built for, whether a device of it is usable).

    Uses ``torch.accelerator`` (torch >= 2.6), whose ``current_accelerator()`` names the build's
    accelerator even when no device is present; availability is checked separately.
    """
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        device = acc.current_accelerator()
        if device is None:
            return None, False
        return device.type, bool(acc.is_available())
    if torch.version.cuda is not None or torch.cuda.is_available():
        return "cuda", torch.cuda.is_available()
    mlu = getattr(torch, "mlu", None)
    if mlu is not None:
        return "mlu", bool(mlu.is_available())
    return None, False


def backend_module(kind: str) -> Any:
    """``torch.cuda`` or ``torch.mlu`` (importing torch_mlu first); None for cpu."""
    if kind == "cpu":
        return None
    why = None
    if kind == "mlu" and getattr(torch, "mlu", None) is None:
        _, why = _import_torch_mlu()
    module = getattr(torch, kind, None)
    if module is None:
        raise UsageError(f"device kind {kind!r} is not available in this torch build"
                         + (f" ({why})" if why else ""))  # fmt: skip
    return module


def _devices(kind: str, module: Any) -> tuple[DeviceInfo, ...]:
    found = []
    for index in range(module.device_count()):
        try:
            props = module.get_device_properties(index)
            name, memory = str(props.name), int(props.total_memory)
        except Exception:  # a runtime without properties still names its devices
            name, memory = str(module.get_device_name(index)), None
        found.append(DeviceInfo(kind, index, name, memory))
    return tuple(found)


def _probe(versions: dict[str, str], key: str, read: Callable[[], Any]) -> None:
    """Record one version if this build can tell it; runtimes differ in what they expose."""
    with contextlib.suppress(Exception):
        value = read()
        versions[key] = ".".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _cuda_driver() -> str:
    raw = int(torch._C._cuda_getDriverVersion())  # e.g. 12040 for 12.4
    return f"{raw // 1000}.{raw % 1000 // 10}"


def _cuda_versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    _probe(versions, "driver", _cuda_driver)
    if torch.backends.cudnn.is_available():
        _probe(versions, "cudnn", torch.backends.cudnn.version)
    _probe(versions, "nccl", torch.cuda.nccl.version)
    return versions


def _mlu_versions(torch_mlu: Any) -> dict[str, str]:
    """torch_mlu's version, CNCL's, and CNNL's through torch_mlu_ops when it is installed."""
    versions = {"torch": torch.__version__}
    _probe(versions, "torch_mlu", lambda: torch_mlu.__version__)
    _probe(versions, "cncl", torch_mlu.mlu.cncl.version)
    ops = None
    with contextlib.suppress(Exception):
        ops = importlib.import_module("torch_mlu_ops")
    if ops is not None:
        _probe(versions, "torch_mlu_ops", lambda: ops.__version__)
        _probe(versions, "cnnl", ops.get_cnnl_version)
    return versions


def discover(kind: str) -> Backend:
    """Probe one device kind. Never raises: an unusable kind comes back with its reason."""
    if kind == "cpu":
        threads = torch.get_num_threads()
        name = f"cpu ({os.cpu_count()} cores, {threads} torch threads)"
        return Backend(
            "cpu", True, None, (DeviceInfo("cpu", None, name),), {"torch": torch.__version__}
        )
    if kind == "cuda":
        if torch.version.cuda is None:
            return Backend("cuda", False, f"torch {torch.__version__} is not a CUDA build")
        if not torch.cuda.is_available():
            return Backend(
                "cuda", False, "CUDA build, but no CUDA device is visible", (), _cuda_versions()
            )
        return Backend("cuda", True, None, _devices("cuda", torch.cuda), _cuda_versions())
    if kind == "mlu":
        torch_mlu, reason = _import_torch_mlu()
        if torch_mlu is None:
            return Backend("mlu", False, reason)
        versions = _mlu_versions(torch_mlu)
        if not torch.mlu.is_available():
            return Backend(
                "mlu", False, "torch_mlu imported, but no MLU device is visible", (), versions
            )
        return Backend("mlu", True, None, _devices("mlu", torch.mlu), versions)
    raise UsageError(f"unknown device kind {kind!r}: expected one of {', '.join(KINDS)}")


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def discover_all() -> list[Backend]:
    return [discover(kind) for kind in KINDS]


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` → the usable accelerator, else cpu; ``cuda``, ``mlu:1`` etc. checked for use."""
    if spec == "auto":
        for kind in ("cuda", "mlu"):
            if discover(kind).available:
                return torch.device(kind, 0)
        return torch.device("cpu")
    kind, _, index = spec.partition(":")
    if kind not in KINDS or (index and not index.isdigit()):
        raise UsageError(f"--device {spec!r}: expected auto, cpu, cuda[:N] or mlu[:N]")
    if kind == "cpu":
        return torch.device("cpu")
    backend = discover(kind)
    if not backend.available:
        raise UsageError(f"--device {spec}: {backend.reason}")
    number = int(index or 0)
    if number >= backend.count:
        raise UsageError(f"--device {spec}: only {backend.count} {kind} device(s) visible")
    return torch.device(kind, number)


def synchronize(device: torch.device | str) -> None:
    """Wait for all work queued on ``device``; a no-op on cpu (its ops are synchronous)."""
    device = torch.device(device)
    if device.type != "cpu":
        backend_module(device.type).synchronize(device)


class Timer(Protocol):
    """Times one region: ``start()``, run the work, ``stop()`` → elapsed seconds."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


# Which clock times work on the cpu device: ``process`` (default), the CPU time this process
# spent, or ``wall``, a monotonic wall clock. A CPU is shared with every other process of the
# host (other workers, other CI jobs): wall time measures that sharing as much as the kernel
# (on a loaded 2-core host the same call measured 2x apart), while the process's CPU time,
# like a device event, counts only the work done for this call. Timing runs single-threaded
# under ``process`` (see ``convmatrix.runners.case.timing.cases``), so the CPU time of a call is its
# latency on one idle core.
CPU_CLOCK_ENV = "CONVMATRIX_CPU_CLOCK"
CPU_CLOCKS = ("process", "wall")


def cpu_clock() -> str:
    """The clock of cpu timings, from ``CONVMATRIX_CPU_CLOCK`` (default ``process``)."""
    value = os.environ.get(CPU_CLOCK_ENV, "").strip() or "process"
    if value not in CPU_CLOCKS:
        raise UsageError(f"{CPU_CLOCK_ENV}={value!r}: choose one of {', '.join(CPU_CLOCKS)}")
    return value


class _ProcessTimer:
    """CPU time of this process, all threads (``CLOCK_PROCESS_CPUTIME_ID``, 1 ns resolution)."""

    def start(self) -> None:
        self._t0 = time.process_time()

    def stop(self) -> float:
        return time.process_time() - self._t0


class _ClockTimer:
    """CPU timing with a monotonic clock (CPU ops complete before they return)."""

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._t0


class _EventTimer:
    """Device timing with events (``torch.cuda.Event`` / ``torch.mlu.Event``): the host does
    not wait between start and stop, so queued work is timed on the device's own clock."""

    def __init__(self, module: Any) -> None:
        self._begin = module.Event(enable_timing=True)
        self._end = module.Event(enable_timing=True)

    def start(self) -> None:
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._begin.elapsed_time(self._end) / 1000.0  # events report milliseconds


def timer(device: torch.device | str) -> Timer:
    """A fresh timer suited to ``device`` (the timing module builds on this factory)."""
    device = torch.device(device)
    if device.type == "cpu":
        return _ProcessTimer() if cpu_clock() == "process" else _ClockTimer()
    return _EventTimer(backend_module(device.type))


def visible_devices_env(
    kind: str, index: int, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment that pins a worker process to device ``index`` of ``kind``.

    ``index`` counts the devices this process sees: when the parent is already restricted
    (``CUDA_VISIBLE_DEVICES=4,5``), index 1 maps to physical device ``5``. The worker then
    sees its device as index 0. cpu needs nothing.
    """
    if kind == "cpu":
        return {}
    if kind not in VISIBLE_ENV:
        raise UsageError(f"unknown device kind {kind!r}: expected one of {', '.join(KINDS)}")
    if index < 0:
        raise UsageError(f"device index must be >= 0, got {index}")
    name = VISIBLE_ENV[kind]
    current = (os.environ if environ is None else environ).get(name)
    if current is None or current.strip() == "":
        return {name: str(index)}
    ids = [part.strip() for part in current.split(",") if part.strip()]
    if index >= len(ids):
        raise UsageError(f"{name}={current} names {len(ids)} device(s); index {index} is outside")
    return {name: ids[index]}
