"""``flash.submit`` and its ``Run``: the public path of ``flashruntime.local``."""

from flashruntime.local.run import Run
from flashruntime.local.submit import submit

__all__ = ["Run", "submit"]
