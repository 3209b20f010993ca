"""``flashruntime worker``: run the worker agent against a coordinator (its options and
handler live with the agent, in ``flashruntime.agent.worker_cli``)."""

from __future__ import annotations

from typing import Any

from flashruntime.agent.worker_cli import DESCRIPTION, add_arguments, handle

__all__ = ["register"]

# The worker asks the coordinator: --api is accepted after the command too.
TALKS_TO_A_COORDINATOR = True


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker", help="run a worker agent that claims and runs tasks from a coordinator", description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(handler=handle)
