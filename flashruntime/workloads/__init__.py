"""Workloads: what the user asks flashruntime to run."""

from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source, to_jobspec

__all__ = ["CommandWorkload", "OutputSpec", "Source", "to_jobspec"]
