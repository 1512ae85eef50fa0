"""The process-wide state a kernel can change, captured before it runs and restored after.

Cases share a process (every case under ``-n 0``, a worker's cases under ``-n N``), so a kernel
that calls ``torch.set_default_device("meta")`` once turned every later case of that process
into a harness error; one that set ``sys.setrecursionlimit(60)`` crashed the harness; one that
ignored SIGTERM kept the controller from stopping. ``ProcessState.capture()`` notes torch's
defaults (default device and dtype, grad mode, threads, deterministic algorithms, anomaly mode,
float32 matmul precision, TF32 and cuDNN flags), the recursion limit, the working directory
and the SIGINT/SIGTERM handlers; ``restore()`` puts back what changed and says what it was.
``runners.case.invoke`` does it around every kernel call (so the reference computed next in the
same case is unharmed) and ``runners.case.execute.run_case`` around the whole case; the case's
message names the kernel and what it changed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = ["ProcessState", "note_changes", "take_changes"]

_changes: list[str] = []  # what kernels changed (and was restored) since take_changes


def _backend_flag(path: str) -> Any:
    obj: Any = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _set_backend_flag(path: str, value: Any) -> None:
    *parents, last = path.split(".")
    obj: Any = torch.backends
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


_NAMES = {
    "cwd": "working directory",
    "sigint_handler": "SIGINT handler",
    "sigterm_handler": "SIGTERM handler",
    "matmul_precision": "float32 matmul precision",
    "anomaly": "autograd anomaly mode",
    "backend_flags": "cuDNN/TF32 flags",
}
_FLAGS = ("cudnn.benchmark", "cudnn.deterministic", "cudnn.allow_tf32", "cuda.matmul.allow_tf32")


@dataclass(frozen=True)
class ProcessState:
    default_device: str
    default_dtype: torch.dtype
    grad_enabled: bool
    num_threads: int
    deterministic: bool
    deterministic_warn_only: bool
    anomaly: bool
    matmul_precision: str
    backend_flags: tuple[Any, ...]
    recursion_limit: int
    cwd: str
    sigint_handler: Any
    sigterm_handler: Any

    @classmethod
    def capture(cls) -> ProcessState:
        return cls(
            default_device=str(torch.get_default_device()),
            default_dtype=torch.get_default_dtype(),
            grad_enabled=torch.is_grad_enabled(),
            num_threads=torch.get_num_threads(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            anomaly=torch.is_anomaly_enabled(),
            matmul_precision=torch.get_float32_matmul_precision(),
            backend_flags=tuple(_backend_flag(f) for f in _FLAGS),
            recursion_limit=sys.getrecursionlimit(),
            cwd=_cwd(),
            sigint_handler=signal.getsignal(signal.SIGINT),
            sigterm_handler=signal.getsignal(signal.SIGTERM),
        )

    def restore(self) -> list[str]:
        """Put back whatever differs from this state now; what did, as ``name (was -> now)``
        phrases, the first one naming torch's setting."""
        now = ProcessState.capture()
        changed = [f.name for f in fields(self) if getattr(self, f.name) != getattr(now, f.name)]
        if not changed:
            return []
        said = []
        for name in changed:
            before, after = getattr(self, name), getattr(now, name)
            with contextlib.suppress(Exception):  # best effort: say it even if it stays
                _RESTORE[name](self)
            shown = _NAMES.get(name, name.replace("_", " "))
            said.append(f"{shown} ({_shown(after)}, restored to {_shown(before)})")
        return said


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed under us: nothing to compare
        return ""


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(_shown(v) for v in value)
    if value is signal.SIG_IGN:
        return "ignored"
    if value is signal.SIG_DFL:
        return "the default"
    return getattr(value, "__name__", None) or str(value)


def _restore_device(state: ProcessState) -> None:
    # cpu is torch's own default: clear whatever device context the kernel installed
    torch.set_default_device(None if state.default_device == "cpu" else state.default_device)


def _restore_deterministic(state: ProcessState) -> None:
    torch.use_deterministic_algorithms(state.deterministic, warn_only=state.deterministic_warn_only)


def _restore_flags(state: ProcessState) -> None:
    for path, value in zip(_FLAGS, state.backend_flags, strict=True):
        if value is not None:
            _set_backend_flag(path, value)


def _handler(signum: int) -> Any:
    def restore(state: ProcessState) -> None:
        handler = state.sigint_handler if signum == signal.SIGINT else state.sigterm_handler
        if handler is not None:  # None: installed from C, nothing Python can put back
            signal.signal(signum, handler)

    return restore


_RESTORE = {
    "default_device": _restore_device,
    "default_dtype": lambda s: torch.set_default_dtype(s.default_dtype),
    "grad_enabled": lambda s: torch.set_grad_enabled(s.grad_enabled),
    "num_threads": lambda s: torch.set_num_threads(s.num_threads),
    "deterministic": _restore_deterministic,
    "deterministic_warn_only": _restore_deterministic,
    "anomaly": lambda s: torch.autograd.set_detect_anomaly(s.anomaly),
    "matmul_precision": lambda s: torch.set_float32_matmul_precision(s.matmul_precision),
    "backend_flags": _restore_flags,
    "recursion_limit": lambda s: sys.setrecursionlimit(s.recursion_limit),
    "cwd": lambda s: os.chdir(s.cwd),
    "sigint_handler": _handler(signal.SIGINT),
    "sigterm_handler": _handler(signal.SIGTERM),
}


def note_changes(changes: list[str]) -> None:
    """Remember what a kernel changed (``take_changes`` hands it to the case's message)."""
    for change in changes:
        if change not in _changes:
            _changes.append(change)


def take_changes() -> list[str]:
    """What kernels changed since the last call (each once), and forget it."""
    taken = list(_changes)
    _changes.clear()
    return taken
