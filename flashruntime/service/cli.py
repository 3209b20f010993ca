"""The ``flashruntime`` command: parse -> library call -> exit code.

argparse only, so the CLI works with the core install; a subcommand imports what
it needs inside its handler, keeping ``flashruntime --help`` fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

import flashruntime
from flashruntime.service.commands import COMMAND_MODULES

Handler = Callable[[argparse.Namespace], int]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashruntime",
        description="Operate ML jobs you already have: launch, checkpoints, recovery, leases.",
    )
    parser.add_argument("--version", action="version", version=f"flashruntime {flashruntime.__version__}")
    parser.add_argument(
        "--api",
        default=None,
        help="coordinator URL (else env FLASHML_RUNTIME_API, else http://localhost:8100)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
