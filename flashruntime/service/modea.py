"""Compatibility path of ``flashruntime.coordinator.expansion`` (task expansion)."""

from flashruntime.coordinator.expansion import *  # noqa: F403
from flashruntime.coordinator.expansion import __all__  # noqa: F401
