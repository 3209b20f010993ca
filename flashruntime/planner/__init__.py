"""Strategy planner: model + hardware + budget + deadline -> a ranked, explained plan
. Pure, deterministic, no ML framework imported; every constant is cited in
``constants`` and the ``catalog_*`` modules.
"""

from flashruntime.planner.core import plan
from flashruntime.planner.explain import render
from flashruntime.planner.version import PLANNER_VERSION

__all__ = ["PLANNER_VERSION", "plan", "render"]
