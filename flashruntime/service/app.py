"""Compatibility path of ``flashruntime.coordinator.app``: ``create_app``,
``RuntimeSettings`` and the lazily built ``app`` (the same object)."""

from typing import Any

from flashruntime.coordinator import app as _app
from flashruntime.coordinator.app import create_app
from flashruntime.coordinator.settings import RuntimeSettings

__all__ = ["RuntimeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
