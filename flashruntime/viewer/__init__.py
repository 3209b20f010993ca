"""The live run page: ``RunViewerServer`` (``.server``), ``collect``
(``.state``), ``render`` and ``TOKENS`` (``.page``). ``page.TOKENS`` is the colour
palette it shares with the coordinator dashboard.

Imported lazily, so the dashboard's use of the palette does not load the HTTP server.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TOKENS", "RunViewerServer", "collect", "render"]

_LAZY = {
    "RunViewerServer": "flashruntime.viewer.server",
    "collect": "flashruntime.viewer.state",
    "render": "flashruntime.viewer.page",
    "TOKENS": "flashruntime.viewer.page",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flashruntime.viewer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
