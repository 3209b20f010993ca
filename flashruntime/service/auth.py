"""Compatibility path of ``flashruntime.coordinator.auth``."""

from flashruntime.coordinator.auth import *  # noqa: F403
from flashruntime.coordinator.auth import __all__  # noqa: F401
