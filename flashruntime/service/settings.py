"""Compatibility path of ``flashruntime.coordinator.settings``."""

from flashruntime.coordinator.settings import RuntimeSettings, parse_selector

__all__ = ["RuntimeSettings", "parse_selector"]
