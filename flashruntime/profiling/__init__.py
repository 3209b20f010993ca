"""Measured plans: ``LocalProfiler`` runs a few real steps of the user's command and answers a
``ProfileResult`` (basis ``profiled``); ``ProfileCache`` keeps results by what determines them;
``CalibrationLedger`` keeps finished runs' figures (basis ``ledger``); ``checkpoint_advice``
gives the Young/Daly checkpoint interval. torch is never imported here: the measured script
imports it.
"""

from flashruntime.errors import InvalidProfileRequest, ProfileError
from flashruntime.profiling.advice import CheckpointAdvice, checkpoint_advice, expected_goodput
from flashruntime.profiling.api import ProfileCache, Profiler, profile_key
from flashruntime.profiling.cache import InMemoryProfileCache, SqliteProfileCache
from flashruntime.profiling.calibration import CalibrationLedger
from flashruntime.profiling.local import LocalProfiler
from flashruntime.protocol.profile_v1alpha1 import ProfileResult

__all__ = [
    "CalibrationLedger",
    "CheckpointAdvice",
    "InMemoryProfileCache",
    "InvalidProfileRequest",
    "LocalProfiler",
    "ProfileCache",
    "ProfileError",
    "ProfileResult",
    "Profiler",
    "SqliteProfileCache",
    "checkpoint_advice",
    "expected_goodput",
    "profile_key",
]
