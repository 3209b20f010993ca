"""``flashruntime.profiling``, an import path of 0.4: measured profiles of a run arrive with the
measurement work, which this release does not have. Until then importing it raises
``ModuleUnavailable`` (an ``ImportError``) saying what to use today: the planner's estimates and
each run's resource telemetry.
"""

from flashruntime.errors import ModuleUnavailable

raise ModuleUnavailable(
    "flashruntime.profiling arrives with the measurement work (measured memory and step time of a run), "
    "which this release does not have yet; it needs no extra. Today, use the planner (flashruntime plan, or "
    "flash.plan in Python): it estimates memory and time per strategy and marks a plan 'profiling required' "
    "when its memory estimate is within 80-95 % of VRAM; and each run's resource telemetry (telemetry.jsonl in "
    "the run directory, flashruntime.monitor, the run page)",
    name=__name__,
)
