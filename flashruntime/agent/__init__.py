"""The worker agent (``flashruntime worker``): registers a machine with a coordinator,
claims leases, runs each task and reports the outcome, speaking only the coordinator's
HTTP protocol through ``flashruntime.client``. Standard library (psutil when present).
"""

from flashruntime.agent.worker import WorkerAgent
from flashruntime.agent.worker_cli import main

__all__ = ["WorkerAgent", "main"]
