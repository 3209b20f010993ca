"""Deterministic failure classification and recovery: signals → class →
decision, with a one-line ``explain`` and a byte-stable ``replay``.
"""

from flashruntime.recovery.budget import RestartBudget
from flashruntime.recovery.policy import COORDINATED, INDEPENDENT, MODES, decide, explain, replay
from flashruntime.recovery.signals import describe_launch, from_local_launch
from flashruntime.recovery.taxonomy import CORRELATED_THRESHOLD, POLICY_VERSION, FailureSignals, classify
from flashruntime.recovery.verdict import AttemptVerdict, judge_exit

__all__ = [
    "COORDINATED",
    "INDEPENDENT",
    "MODES",
    "POLICY_VERSION",
    "RestartBudget",
    "CORRELATED_THRESHOLD",
    "FailureSignals",
    "classify",
    "decide",
    "explain",
    "replay",
    "from_local_launch",
    "describe_launch",
    "AttemptVerdict",
    "judge_exit",
]
