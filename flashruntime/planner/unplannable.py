"""The one error the planner raises internally: a request it cannot resolve (unknown
model or GPU without the missing figure, no GPUs for a GPU workload). ``plan`` turns it
into a report whose ``no_valid_strategy_hint`` is the message (step 2 of the pipeline).
"""

from __future__ import annotations

from flashruntime.errors import (
    UnplannableRequest,  # noqa: F401  (defined there, re-exported here)
)
