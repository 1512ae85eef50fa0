"""What fla asks of a GPU that a CPU under the Triton interpreter cannot answer, bridged.

Each bridge is installed only when fla's own call fails (tried first), and what was used is
returned for the run's record:

- **SM count.** flash-linear-attention 0.2.2-0.4.1 size the time tile from the GPU:
  ``BT = min(64, next_power_of_2(cdiv(max(16, B*T), get_multiprocessor_count())))``, asked of
  Triton's active driver, which the interpreter does not have (0.3.1-0.4.1 raise
  ``RuntimeError: 0 active drivers``; 0.2.2 returns -1, which makes BT negative). The bridge
  answers ``CONVMATRIX_FLA_SM_COUNT`` (default 1). With 1 SM every call that spans more than
  one tile uses BT = 64, and a call with B*T < 64 one tile of at least T tokens: the kernel
  then tiles time exactly like fla-core 0.4.2+'s fixed ``chunk_size`` 64, which the matrices'
  ``tile`` cases are written for, and the interpreter runs the fewest programs. A GPU's count
  (132 on an H100) gives small tiles to small problems (BT = 8 at B*T = 591); set the variable
  to reproduce that (the kernel then declares no time tile: it changes with B*T).
- **Device context.** fla's ``input_guard`` enters ``custom_device_ctx(x.device.index)``,
  which before fla-core 0.6 is ``torch.<backend>.device(index)``; on a CPU the backend is
  ``cpu`` and ``torch.cpu.device`` does not exist (``AttributeError``). The bridge enters
  nothing for a CPU tensor (index None), as fla-core 0.6's own fallback does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["SM_COUNT_ENV", "install", "sm_count"]

SM_COUNT_ENV = "CONVMATRIX_FLA_SM_COUNT"


def sm_count() -> int:
    """The SM count the bridge answers (``CONVMATRIX_FLA_SM_COUNT``, default 1)."""
    text = os.environ.get(SM_COUNT_ENV, "1").strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{SM_COUNT_ENV}={text!r}: give a positive whole number of SMs")
    return int(text)


def _bridge_sm_count(modules: list[Any]) -> dict[str, Any] | None:
    users = [m for m in modules if callable(vars(m).get("get_multiprocessor_count"))]
    if not users:
        return None  # fla-core 0.4.2+: a fixed chunk size
    original = vars(users[0])["get_multiprocessor_count"]
    forced = os.environ.get(SM_COUNT_ENV) is not None
    try:
        count = None if forced else int(original(0))
    except Exception as exc:  # no active driver under the interpreter
        count, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = f"{SM_COUNT_ENV} is set" if forced else f"fla answered {count}"
    if count is not None and count >= 1:
        return {"sm_count": count, "bridged": None}
    count = sm_count()

    def get_multiprocessor_count(*args: Any, **kwargs: Any) -> int:
        return count

    for module in users:
        module.get_multiprocessor_count = get_multiprocessor_count
    return {"sm_count": count, "bridged": why}


def _bridge_device_context(modules: list[Any]) -> dict[str, Any] | None:
    guard = next((vars(m)["input_guard"] for m in modules if "input_guard" in vars(m)), None)
    scope: dict[str, Any] = getattr(guard, "__globals__", {})
    original: Callable[[Any], Any] | None = scope.get("custom_device_ctx")
    if original is None:
        return None
    try:
        with original(None):  # a CPU tensor's device.index
            pass
    except Exception as exc:  # torch.cpu.device does not exist
        why = f"{type(exc).__name__}: {exc}"
    else:
        return None

    def custom_device_ctx(index: Any) -> Any:
        return contextlib.nullcontext() if index is None else original(index)

    scope["custom_device_ctx"] = custom_device_ctx
    return {"bridged": why, "with": "nullcontext for CPU tensors"}


def install(modules: tuple[Any, ...]) -> dict[str, Any]:
    """Bridge what fails in ``modules`` (fla's conv modules); {bridge: what was used}."""
    unique = list({id(m): m for m in modules}.values())
    found = {
        "sm_count": _bridge_sm_count(unique),
        "device_context": _bridge_device_context(unique),
    }
    return {name: value for name, value in found.items() if value is not None}
