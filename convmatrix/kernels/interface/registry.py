"""Finding kernels: registered names (entry-point group ``convmatrix.kernels``), ``FAMILY:NAME``
specs of a family (entry-point group ``FAMILY_GROUP``: ``seeded:taps_reversed``)
or ``package.module:attribute`` specs, resolved to kernel objects.

An entry point or attribute may be a kernel object, a kernel class, or a zero-argument factory.
Loading never imports a device runtime at registry time: adapters import lazily and answer
``availability()`` with the reason they cannot run here.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from convmatrix.core.moved import MOVED
from convmatrix.kernels.interface.protocol import Kernel

__all__ = ["KernelInfo", "KernelLoadError", "KernelSpecError", "list_kernels", "load"]

GROUP = "convmatrix.kernels"

# Built-ins resolved without package metadata, so a source checkout works uninstalled too.
_BUILTIN = {
    "reference": "convmatrix.kernels.oracle.reference:ReferenceKernel",
    "torch": "convmatrix.kernels.builtin.framework:TorchKernel",
    "tiled": "convmatrix.kernels.builtin.tiled:TiledKernel",
    "tiled-small": "convmatrix.kernels.builtin.tiled:small",
    "dao": "convmatrix.kernels.adapters.dao:DaoKernel",
    "mlu_vllm": "convmatrix.kernels.adapters.mlu_vllm:MluVllmKernel",
    "mlu_fla": "convmatrix.kernels.adapters.mlu_fla:MluFlaKernel",
    "fla": "convmatrix.kernels.adapters.fla:FlaKernel",
    "vllm": "convmatrix.kernels.adapters.vllm:VllmKernel",
}


class KernelSpecError(LookupError):
    """A --kernel SPEC names nothing loadable; the message says what was tried."""


class KernelLoadError(KernelSpecError):
    """The SPEC names a kernel that exists but could not be loaded: its module raised while
    importing (a dependency missing, a Triton without ``tl.make_block_ptr``) or making the
    kernel raised. Not a typo: a kernel that judged nothing (exit 4), which ``bisect`` skips
    at that commit rather than calling it bad."""


def _registered() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.value
    return found


MAX_NAME = 200  # runs.kernel is a varchar(200)


def _factory(obj: Any) -> bool:
    """Whether ``obj`` may be called to make the kernel: a class with ``forward``, or a Python
    function outside the standard library taking no required argument. Anything else a spec
    names (``os:system``, ``os:abort``) is never called."""
    if isinstance(obj, type):
        return hasattr(obj, "forward")
    if not inspect.isfunction(obj):
        return False
    top = (obj.__module__ or "").split(".")[0]
    if top in sys.stdlib_module_names:
        return False
    try:
        inspect.signature(obj).bind()
    except TypeError:
        return False
    return True


def _instantiate(obj: Any, spec: str) -> Kernel:
    if _factory(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise KernelLoadError(
                f"{spec!r}: making the kernel raised {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(obj, Kernel):
        raise KernelSpecError(
            f"{spec!r} is not a kernel: it needs name, capabilities, forward, update, "
            "availability and contract_violation (see convmatrix.kernels.KernelBase)"
        )
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\x00" in name:
        shown = repr(name)[:60]
        raise KernelSpecError(
            f"{spec!r}: the kernel's name must be text of 1 to {MAX_NAME} characters "
            f"without NUL (the database column), got {shown}"
        )
    return obj


# ``package.module:attribute`` specs whose attribute moved to another module (module moves
# alone are ``convmatrix.core.moved.MOVED``): specs people typed, runs stored for ``--resume``.
# The adapters over the in-project stand-ins went to the doubles, beside the stand-ins.
MOVED_SPECS = {
    f"convmatrix.kernels.{old}:standin": f"convmatrix.kernels.doubles.standins:{new}"
    for module, new in (("mlu_vllm", "mlu_vllm"), ("mlu_fla", "mlu_fla"), ("vllm", "vllm"))
    for old in (module, f"adapters.{module}")
}


def _import_attr(target: str, spec: str) -> Any:
    module_name, _, attr = MOVED_SPECS.get(target, target).partition(":")
    # where the module lives now, without the warning an import of the old path gives
    module_name = MOVED.get(module_name, module_name)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the module's own code raised, whatever it raised
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        named = missing is not None and (module_name + ".").startswith(missing + ".")
        error = KernelSpecError if named else KernelLoadError  # a typo, or a broken kernel
        why = f"{type(exc).__name__}: {exc}" if error is KernelLoadError else str(exc)
        raise error(f"cannot import {module_name!r} for kernel {spec!r}: {why}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise KernelSpecError(f"{module_name!r} has no attribute {attr!r}") from exc
    return obj


FAMILY_GROUP = "convmatrix.kernel_families"

# Families of kernels named ``PREFIX:NAME``: prefix -> the module that makes them, with
# ``load(spec) -> Kernel`` and ``listed() -> [(spec, target)]``. Named, not imported, so the
# interface imports no kernel; built in (like ``_BUILTIN``) so a source checkout works uninstalled.
_FAMILIES = {"seeded": "convmatrix.kernels.doubles.seeded"}


def _families() -> dict[str, str]:
    found = dict(_FAMILIES)
    for ep in entry_points(group=FAMILY_GROUP):
        found[ep.name] = ep.value
    return found


def _family(prefix: str) -> Any:
    """The module of the family ``prefix``, imported now (its first ``load``)."""
    return importlib.import_module(_families()[prefix])


def load(spec: str) -> Kernel:
    """A kernel from a registered name, ``FAMILY:NAME`` (``seeded:NAME``: a seeded-bug kernel of
    ``convmatrix.kernels.doubles.seeded``) or ``package.module:attr`` (object, class or
    factory)."""
    prefix, colon, _ = spec.partition(":")
    if colon and prefix in _families():
        try:
            return _family(prefix).load(spec)
        except Exception as exc:
            raise KernelSpecError(str(exc)) from None
    registered = _registered()
    if spec in registered:
        return _instantiate(_import_attr(registered[spec], spec), spec)
    if ":" in spec:
        return _instantiate(_import_attr(spec, spec), spec)
    raise KernelSpecError(
        f"unknown kernel {spec!r}: registered kernels are {', '.join(sorted(registered))}; "
        "or give package.module:attribute"
    )


@dataclass(frozen=True)
class KernelInfo:
    name: str
    target: str
    status: str  # "available" or "unavailable: <reason>"


def list_kernels(seeded: bool = False) -> list[KernelInfo]:
    """Every registered kernel with its availability on this machine; with ``seeded`` the
    seeded-bug kernels too (``seeded:NAME``)."""
    infos = []
    targets = sorted(_registered().items())
    if seeded:
        targets += _family("seeded").listed()
    for name, target in targets:
        try:
            reason = load(name).availability()
        except Exception as exc:  # a broken plugin must not hide the others
            reason = f"{type(exc).__name__}: {exc}"
        infos.append(
            KernelInfo(name, target, "available" if reason is None else f"unavailable: {reason}")
        )
    return infos
