"""Compatibility import path: a local run's goodput ledger lives in ``flashruntime.goodput.run`` now."""

from flashruntime.goodput.run import (
    METRICS_FILE,
    AttemptSteps,
    GoodputLedger,
    Recovery,
    attempt_steps,
    goodput_ledger,
    ledger_lines,
    ledger_of_run,
    step_records,
)

__all__ = [
    "METRICS_FILE",
    "AttemptSteps",
    "GoodputLedger",
    "Recovery",
    "attempt_steps",
    "goodput_ledger",
    "ledger_lines",
    "ledger_of_run",
    "step_records",
]
