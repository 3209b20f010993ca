"""Compatibility path of ``flashruntime.coordinator.dashboard`` (the coordinator's page)."""

from flashruntime.coordinator.dashboard import DASHBOARD_HTML

__all__ = ["DASHBOARD_HTML"]
