"""The worker agent's command line: ``flashruntime worker`` and ``python -m flashruntime.agent``.

Exit codes: 0 stopped after ``--max-tasks``, by SIGINT/SIGTERM or by a drain; 1 registration
refused (401/403); 2 coordinator unreachable at startup, the work directory unusable or held
by another worker, or invalid options. ``--drain --work-dir D`` asks the worker running in D
to finish its current task and exit (SIGUSR1): 0 when asked, 1 when no worker runs there.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_API = "http://localhost:8100"
RUNNER_CHOICES = ("sandboxed", "subprocess", "trusted")
EXIT_INVALID = 2
EXIT_NO_WORKER = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", default=None, metavar="URL",
                        help="coordinator URL (default: --api, else env FLASHML_RUNTIME_API, else " + DEFAULT_API + ")")
    # No default here: ``flashruntime --token T worker`` gives it before the command.
    parser.add_argument("--token", default=argparse.SUPPRESS,
                        help="node bearer token; visible to every user in ps, so prefer --token-file (else env "
                             "FLASHML_NODE_TOKEN)")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="file holding the node bearer token, mode 0600 or stricter (else env "
                             "FLASHML_NODE_TOKEN_FILE); hidden from every task")
    parser.add_argument("--node-id", default=None, help="node id to register (default: the hostname)")
    parser.add_argument("--join-code", default=None, help="registration join code (else env FLASHML_JOIN_CODE)")
    parser.add_argument("--runner", choices=RUNNER_CHOICES, default=None,
                        help="sandboxed: task modules and commands of isolation tier 'sandboxed', in a bubblewrap "
                             "sandbox (read-only filesystem but the lease's directory, no network unless the job "
                             "asks); subprocess: task modules only; trusted: also commands of team pools, sharing "
                             "the filesystem and network (default: sandboxed where bubblewrap works, else "
                             "subprocess)")
    parser.add_argument("--task-user", default=None, metavar="NAME",
                        help="run every task as this user, its output, home, temp and checkpoint directories "
                             "handed to it (the worker must run as root)")
    parser.add_argument("--max-tasks", type=int, default=0, metavar="N",
                        help="stop after N completed or failed tasks (default 0 = unlimited)")
    parser.add_argument("--work-dir", default=None, help="directory for task work dirs (default: a new temp dir)")
    parser.add_argument("--poll-seconds", type=float, default=2.0,
                        help="wait between empty claims, ±20%% jitter (default 2.0)")
    parser.add_argument("--log-upload-seconds", type=float, default=None, metavar="S",
                        help="how often a running task's log and step records go up to the coordinator, when they "
                             "grew, for its logs and the dashboard's curves (default 10; more often costs bandwidth)")
    parser.add_argument("--pools", default="", metavar="a,b", help="team pools this node serves, comma-separated")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=PATH",
                        help="a local dataset offered to tasks as local_inputs (repeatable)")
    parser.add_argument("--trusted-submitter-keys", default=None, metavar="FILE_OR_DIR",
                        help="run only commands signed by one of these submitter keys (a .pub file of "
                             "'flashruntime keys generate', or a directory of them; else env "
                             "FLASHML_TRUSTED_SUBMITTER_KEYS), so a coordinator cannot run code of its own here")
    parser.add_argument("--node-addr", default=None, metavar="ADDR",
                        help="the address the other nodes of a multi-node job reach this machine at (torchrun's "
                             "--local-addr); default: torchrun's lookup of this host's name")
    parser.add_argument("--drain", action="store_true",
                        help="start no worker: ask the one running with this --work-dir to finish its current task "
                             "and exit (it is sent SIGUSR1); exit 1 when none runs there")


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


def default_runner(probe: Any) -> tuple[str, str]:
    """The runner when ``--runner`` is not given, and why: the sandbox where bwrap works."""
    if probe.works:
        return "sandboxed", f"the default where bubblewrap works ({probe.reason})"
    return "subprocess", f"the default where bubblewrap does not work: {probe.reason}; task modules only"


def resolve_token(args: argparse.Namespace, environ: Any = os.environ) -> tuple[str | None, str | None]:
    """(token, token file): ``--token``, else ``--token-file``, else env FLASHML_NODE_TOKEN_FILE,
    else env FLASHML_NODE_TOKEN. The file is read by the agent, which also masks it in tasks."""
    token = getattr(args, "token", None) or None
    token_file = getattr(args, "token_file", None) or environ.get("FLASHML_NODE_TOKEN_FILE") or None
    if token is None and token_file is None:
        token = environ.get("FLASHML_NODE_TOKEN") or None
    return token, token_file


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class _EarlySignals:
    """Stop and drain signals that arrive before the agent listens (while it is imported and
    built): kept, and handed to the agent, instead of killing the process by the signal."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.agent: Any = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        signals = [signal.SIGINT, signal.SIGTERM]
        if hasattr(signal, "SIGUSR1"):
            signals.append(signal.SIGUSR1)
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.agent is None:
            self.received.append(signum)
        else:  # after run() returned, on the way out: nothing left to stop, and no death by signal
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        if signum == getattr(signal, "SIGUSR1", None):
            self.agent.drain()
        else:
            self.agent.stop()

    def hand_over(self, agent: Any) -> None:
        self.agent = agent
        for signum in self.received:
            self._forward(signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def drain_running_worker(work_dir: str | None, *, send: Callable[[int, int], None] = os.kill) -> int:
    """``--drain``: SIGUSR1 to the worker holding ``work_dir``'s lock; the exit code."""
    from flashruntime.agent.state import lock_holder

    if not work_dir:
        print("error: --drain needs the --work-dir of the worker to drain", file=sys.stderr)
        return EXIT_INVALID
    drain_signal = getattr(signal, "SIGUSR1", None)
    if drain_signal is None:
        print("error: --drain needs SIGUSR1, which this platform does not have; stop the worker with Ctrl-C "
              "instead (its lease is released, not failed)", file=sys.stderr)
        return EXIT_INVALID
    directory = Path(os.path.expanduser(work_dir))
    holder = lock_holder(directory)
    if holder is None:
        print(f"error: no worker is running in {directory}", file=sys.stderr)
        return EXIT_NO_WORKER
    if holder.pid is None:
        print(f"error: a worker holds {directory}, but its lock file does not say which process; try again",
              file=sys.stderr)
        return EXIT_NO_WORKER
    if not holder.drains_on_sigusr1:
        print(f"error: the worker in {directory} (pid {holder.pid}) does not take signals (it runs off the main "
              "thread of its program); call its WorkerAgent.drain() instead", file=sys.stderr)
        return EXIT_INVALID
    try:
        send(holder.pid, drain_signal)
    except ProcessLookupError:
        print(f"error: no worker is running in {directory} (pid {holder.pid} has ended)", file=sys.stderr)
        return EXIT_NO_WORKER
    except PermissionError:
        print(f"error: not allowed to signal the worker in {directory} (pid {holder.pid}); run --drain as its "
              "user", file=sys.stderr)
        return EXIT_INVALID
    node = f", node {holder.node_id}" if holder.node_id else ""
    print(f"worker pid {holder.pid}{node} in {directory} is draining: it finishes its current task, then exits")
    return 0


def handle(args: argparse.Namespace) -> int:
    if getattr(args, "drain", False):
        return drain_running_worker(args.work_dir)
    early = _EarlySignals()
    if _on_main_thread():
        early.install()
    try:
        return _run_worker(args, early)
    finally:
        if _on_main_thread():
            early.restore()


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _run_worker(args: argparse.Namespace, early: _EarlySignals) -> int:
    from flashruntime.agent.node_token import forget_token_environment, make_non_dumpable
    from flashruntime.agent.sandbox import probe_bwrap
    from flashruntime.agent.worker import WorkerAgent

    _configure_logging()
    log = logging.getLogger("flashruntime.worker")
    token, token_file = resolve_token(args)
    join_code = args.join_code or os.environ.get("FLASHML_JOIN_CODE") or None
    # Out of what every child inherits, and out of reach of same-user processes: the
    # environment the process started with stays in /proc/<pid>/environ, non-dumpable hides it.
    forget_token_environment()
    if not make_non_dumpable():
        log.warning("cannot make the worker non-dumpable on this platform: a task of the worker's own user could "
                    "read its environment and memory")
    if getattr(args, "token", None):
        log.warning("--token puts the node token in the process list (ps, /proc/<pid>/cmdline), where every user "
                    "and task on this machine can read it; write it into a file of mode 0600 and pass "
                    "--token-file PATH instead")
    runner, probe = args.runner, None
    if runner in (None, "sandboxed", "trusted"):
        probe = probe_bwrap()
    if runner is None:
        runner, why = default_runner(probe)
        log.info("runner %s: %s", runner, why)
    try:
        agent = WorkerAgent(
            resolve_coordinator(args),
            token=token,
            token_file=token_file,
            task_user=args.task_user,
            sandbox_probe=probe,
            node_id=args.node_id,
            runner=runner,
            max_tasks=args.max_tasks,
            work_dir=args.work_dir,
            join_code=join_code,
            poll_seconds=args.poll_seconds,
            timing=_timing(args),
            pools=[pool for pool in args.pools.split(",") if pool.strip()],
            datasets=parse_datasets(args.dataset),
            trusted_submitter_keys=(getattr(args, "trusted_submitter_keys", None)
                                    or os.environ.get("FLASHML_TRUSTED_SUBMITTER_KEYS") or None),
            node_addr=args.node_addr,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    early.hand_over(agent)
    return agent.run()


def _timing(args: argparse.Namespace) -> Any:
    """The agent's ``WorkerTiming`` for the options given, or None for the defaults."""
    from flashruntime.agent.lease_run import WorkerTiming

    seconds = getattr(args, "log_upload_seconds", None)
    if seconds is None:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"--log-upload-seconds must be a number of seconds > 0, got {seconds:g}")
    return WorkerTiming(log_upload_s=seconds)


def main(argv: list[str] | None = None) -> int:
    """``python -m flashruntime.agent [options]``: the ``flashruntime worker`` command."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))
