"""Compatibility import path: a coordinator job's goodput ledger lives in ``flashruntime.goodput.job`` now."""

from flashruntime.goodput.job import JobGoodput, JobRecovery, job_goodput, job_goodput_lines

__all__ = ["JobGoodput", "JobRecovery", "job_goodput", "job_goodput_lines"]
