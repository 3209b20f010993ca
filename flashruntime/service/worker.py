"""Compatibility path of the worker agent (``flashruntime.agent``); ``python -m
flashruntime.service.worker`` runs it as before."""

import sys

from flashruntime.agent.worker_cli import main
from flashruntime.agent.worker import WorkerAgent

__all__ = ["WorkerAgent", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
