"""The worker agent (``flashruntime worker``): registers a machine with a coordinator,
claims leases, runs each task and reports the outcome, speaking only the coordinator's
HTTP protocol through ``flashruntime.client``. Standard library (psutil when present).
"""

from flashruntime.agent.command import main
from flashruntime.agent.worker import WorkerAgent

__all__ = ["WorkerAgent", "main"]
