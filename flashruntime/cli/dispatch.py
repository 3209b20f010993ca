"""The ``flashruntime`` command: parse -> library call -> exit code.

argparse only, so the CLI works with the core install; a subcommand imports what
it needs inside its handler, keeping ``flashruntime --help`` fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import select
import shlex
import sys
from collections.abc import Callable, Sequence

import flashruntime

Handler = Callable[[argparse.Namespace], int]

# One module per subcommand, each with ``register(subparsers)``, which adds the subparser
# and sets ``handler``; a handler imports what it needs, so building the parser stays
# cheap. Order = order in ``flashruntime --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "flashruntime.cli.submit",
    "flashruntime.cli.chaos",
    "flashruntime.cli.runs",
    "flashruntime.cli.view",
    "flashruntime.cli.demo",
    "flashruntime.cli.plan",
    "flashruntime.cli.jobs",
    "flashruntime.cli.job_output",
    "flashruntime.cli.serve",
    "flashruntime.cli.db",
    "flashruntime.cli.worker",
    "flashruntime.cli.keys",
)


API_HELP = "coordinator URL (else env FLASHML_RUNTIME_API, else http://localhost:8100)"
TOKEN_HELP = ("bearer token for the coordinator: a submitter's or operator's for the job commands (else env "
              "FLASHML_TOKEN), the node's for worker (else env FLASHML_NODE_TOKEN)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashruntime",
        description="Operate ML jobs you already have: launch, checkpoints, recovery, leases. "
                    "--api and --token may also follow the command.",
    )
    parser.add_argument("--version", action="version", version=f"flashruntime {flashruntime.__version__}")
    parser.add_argument("--api", default=None, help=API_HELP)
    parser.add_argument("--token", default=None, help=TOKEN_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        before = set(subparsers.choices)
        module = importlib.import_module(module_name)
        module.register(subparsers)
        if getattr(module, "TALKS_TO_A_COORDINATOR", False):  # local commands do not offer --api
            for name in set(subparsers.choices) - before:
                _accept_global_options(subparsers.choices[name])
    return parser


def _accept_global_options(parser: argparse.ArgumentParser) -> None:
    """``--api`` after the command as before it. Without a default here (SUPPRESS), a value given
    before the command survives the subcommand's parse; one given after it wins. A subcommand that
    defines the option itself (``--token``, where it means something) keeps its own."""
    group = parser.add_argument_group("global options (also accepted before the command)")
    try:
        group.add_argument("--api", default=argparse.SUPPRESS, help=API_HELP)
    except argparse.ArgumentError:
        pass  # the subcommand has its own --api


EXIT_STDOUT_CLOSED = 1


def _subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser | None:
    """The parser of the command ``args`` were parsed for, None before a command."""
    command = getattr(args, "command", None)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command:
            return action.choices.get(command)
    return None


def unrecognised_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" with what was probably meant: the closest option
    of the command for a misspelt one, or, after ``submit``, the command in quotes (a command
    is one argument: ``submit python train.py`` leaves ``train.py`` over)."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    command = getattr(args, "command", None)
    subparser = _subparser(parser, args)
    options = [option for each in (parser, subparser) if each is not None
               for action in each._actions for option in action.option_strings if option.startswith("--")]
    hints = []
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.partition("=")[0], options, n=1, cutoff=0.6)
            if close:
                hints.append(f"{extra.partition('=')[0]}: did you mean {close[0]}?")
    if not hints and command == "submit" and isinstance(getattr(args, "cmd", None), str):
        quoted = shlex.join([args.cmd, *extras])
        hints.append(f"quote the command, so it is one argument: flashruntime submit {shlex.quote(quoted)}")
    where = f"flashruntime {command} --help" if command else "flashruntime --help"
    return "; ".join([message, *hints]) + f" (see {where})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # told with the usage of the command they were given to
        (_subparser(parser, args) or parser).error(unrecognised_arguments(parser, args, extras))
    handler: Handler | None = getattr(args, "handler", None)
    try:
        if handler is None:
            parser.print_help()
            code = 0
        else:
            code = handler(args)
        if sys.stdout is not None:  # None when the process started with fd 1 closed: print() writes nothing
            sys.stdout.flush()  # inside the try: a reader gone by now (| head) is seen here, not at exit
    except BrokenPipeError:
        if not _stdout_broken():
            raise  # another pipe (stderr, a socket): not the quiet end of `| head`
        return _stdout_closed()
    return code


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports POLLERR on its write end).
    Where that cannot be asked (no poll, no file descriptor), assume so, as before."""
    poll = getattr(select, "poll", None)
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    if poll is None:
        return True
    poller = poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _stdout_closed() -> int:
    """The reader of stdout went away (``flashruntime runs | head -1``): stop quietly, as Unix
    tools do. stdout now points at devnull so the interpreter's final flush cannot fail again
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file descriptor (replaced in-process): nothing to redirect
        pass
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
