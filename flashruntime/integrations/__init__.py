"""Builders that turn a framework script into a ``CommandWorkload``.

``integrations.pytorch.ddp``, ``integrations.sklearn.sweep``/``hpo`` and
``integrations.huggingface.trainer`` only build argv; the frameworks themselves are
imported inside the few functions that need them, and the submodules load on first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["huggingface", "pytorch", "sklearn"]


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
