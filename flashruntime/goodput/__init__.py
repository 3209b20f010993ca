"""Goodput ledgers: how much of the time spent went into work that counts, with the MTTD
and MTTR of each recovery. ``job`` reads a coordinator job's events (machine time across
the fleet); ``run`` reads a local run's ``run.json`` and ``metrics.jsonl`` (wall time);
``report`` is the text both print. Pure, apart from ``ledger_of_run`` reading the run."""

from flashruntime.goodput.job import JobGoodput, JobRecovery, job_goodput, job_goodput_lines
from flashruntime.goodput.run import (
    AttemptSteps,
    GoodputLedger,
    Recovery,
    goodput_ledger,
    ledger_lines,
    ledger_of_run,
    step_records,
)

__all__ = [
    "AttemptSteps",
    "GoodputLedger",
    "JobGoodput",
    "JobRecovery",
    "Recovery",
    "goodput_ledger",
    "job_goodput",
    "job_goodput_lines",
    "ledger_lines",
    "ledger_of_run",
    "step_records",
]
