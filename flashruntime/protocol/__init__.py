"""Wire protocol: the v1alpha1 job/lease/checkpoint/recovery models and the planner models."""

from flashruntime.protocol.plan_v1alpha1 import *  # noqa: F401,F403
from flashruntime.protocol.plan_v1alpha1 import __all__ as _plan_all
from flashruntime.protocol.v1alpha1 import *  # noqa: F401,F403
from flashruntime.protocol.v1alpha1 import __all__ as _v1_all

__all__ = sorted(set(_v1_all) | set(_plan_all))
