"""Compatibility path of ``flashruntime.coordinator.settings``."""

from flashruntime.coordinator.settings import RuntimeSettings

__all__ = ["RuntimeSettings"]
