"""The worker agent's command line: ``flashruntime worker`` and ``python -m flashruntime.agent``.

Exit codes: 0 stopped after ``--max-tasks`` or by SIGINT/SIGTERM; 1 registration refused
(401/403); 2 coordinator unreachable at startup, or invalid options.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

DEFAULT_API = "http://localhost:8100"
EXIT_INVALID = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", default=None, metavar="URL",
                        help="coordinator URL (default: --api, else env FLASHML_RUNTIME_API, else " + DEFAULT_API + ")")
    # No default here: ``flashruntime --token T worker`` gives it before the command.
    parser.add_argument("--token", default=argparse.SUPPRESS, help="node bearer token (else env FLASHML_NODE_TOKEN)")
    parser.add_argument("--node-id", default=None, help="node id to register (default: the hostname)")
    parser.add_argument("--join-code", default=None, help="registration join code (else env FLASHML_JOIN_CODE)")
    parser.add_argument("--runner", choices=("subprocess", "trusted"), default="subprocess",
                        help="subprocess: allowlisted task modules only; trusted: also argv payloads of "
                             "team pools, without a container (default subprocess)")
    parser.add_argument("--max-tasks", type=int, default=0, metavar="N",
                        help="stop after N completed or failed tasks (default 0 = unlimited)")
    parser.add_argument("--work-dir", default=None, help="directory for task work dirs (default: a new temp dir)")
    parser.add_argument("--poll-seconds", type=float, default=2.0,
                        help="wait between empty claims, ±20%% jitter (default 2.0)")
    parser.add_argument("--pools", default="", metavar="a,b", help="team pools this node serves, comma-separated")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=PATH",
                        help="a local dataset offered to tasks as local_inputs (repeatable)")


DESCRIPTION = "Register with a coordinator, claim leases, run them, upload outputs."


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser (``python -m flashruntime.agent``) with the global ``--api`` too."""
    parser = argparse.ArgumentParser(prog="python -m flashruntime.agent", description=DESCRIPTION)
    parser.add_argument("--api", default=None, help="coordinator URL (else env FLASHML_RUNTIME_API)")
    add_arguments(parser)
    parser.set_defaults(handler=handle)
    return parser


def resolve_coordinator(args: argparse.Namespace) -> str:
    """``--coordinator``, else the global ``--api``, else env FLASHML_RUNTIME_API, else the default."""
    return (args.coordinator or getattr(args, "api", None) or os.environ.get("FLASHML_RUNTIME_API")
            or DEFAULT_API)


def parse_datasets(values: list[str]) -> dict[str, str]:
    """``NAME=PATH`` pairs → {name: path}; a malformed or repeated name raises ``ValueError``."""
    datasets: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise ValueError(f"--dataset {value!r} must be NAME=PATH, e.g. --dataset imagenet=/data/imagenet")
        if name in datasets:
            raise ValueError(f"--dataset {name!r} is given twice")
        if not Path(os.path.expanduser(path)).exists():
            raise ValueError(f"--dataset {name}: path {path!r} does not exist")
        datasets[name] = path
    return datasets


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def handle(args: argparse.Namespace) -> int:
    from flashruntime.agent.worker import WorkerAgent

    try:
        agent = WorkerAgent(
            resolve_coordinator(args),
            token=getattr(args, "token", None) or os.environ.get("FLASHML_NODE_TOKEN") or None,
            node_id=args.node_id,
            runner=args.runner,
            max_tasks=args.max_tasks,
            work_dir=args.work_dir,
            join_code=args.join_code or os.environ.get("FLASHML_JOIN_CODE") or None,
            poll_seconds=args.poll_seconds,
            pools=[pool for pool in args.pools.split(",") if pool.strip()],
            datasets=parse_datasets(args.dataset),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    _configure_logging()
    return agent.run()


def main(argv: list[str] | None = None) -> int:
    """``python -m flashruntime.agent [options]``: the ``flashruntime worker`` command."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))
