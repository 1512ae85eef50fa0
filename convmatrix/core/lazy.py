"""Package attributes imported on first use (PEP 562), for the packages' public names.

``import convmatrix`` and the ``convmatrix`` command must not import torch, SQLAlchemy or
Jinja2 before a command needs them; a package re-exports its public names through
``lazy_attributes`` instead of importing their modules eagerly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where`` maps each name to the module that
    defines it; the first access imports it and caches the value on the package."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
