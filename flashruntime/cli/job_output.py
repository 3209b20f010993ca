"""The coordinator's jobs and what each leaves, from a shell: ``jobs`` (the jobs the token
may see, newest first), ``logs`` (its tasks' logs, ``--follow`` until the job
ends), ``tasks`` (a table of its tasks), ``goodput`` (its goodput ledger, from its events)
and ``artifacts`` (a listing; ``--download DIR`` fetches each file and checks its sha256).
``--json`` prints the coordinator's answer (for ``goodput``, the ledger) instead.

Exit codes as for the other job commands: 0 success; 1 HTTP status >= 400 (printed), or a
download that failed its checks; 2 coordinator unreachable or ``--api`` not a URL; 130 when
Ctrl-C stops ``logs --follow``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from flashruntime.cli._api import resolve_api
from flashruntime.cli._arguments import whole_number
from flashruntime.cli.jobs import (
    EXIT_HTTP_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    add_job_id,
    add_token_option,
    ago,
    cli_client,
    coordinator_call,
    table,
)
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CommandError
from flashruntime.protocol.task_logs import last_lines

__all__ = ["FOLLOW_POLL_S", "new_text", "register", "safe_destination"]

# How often ``logs --follow`` asks again. A worker uploads a running task's log every 10 s
# when it grew, so asking much more often would only repeat the same answer.
FOLLOW_POLL_S = 2.0

# Every command here asks the coordinator: --api is accepted after the command too.
TALKS_TO_A_COORDINATOR = True

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
_ANCHOR_LINES = 64  # the most final lines of the last answer looked for in the next


def register(subparsers: Any) -> None:
    _register_jobs(subparsers)
    parser = subparsers.add_parser(
        "logs", help="print a job's task logs (--follow: until the job ends)",
        description="Print the logs of a job's tasks, as their workers uploaded them (the last MiB of each "
                    "task's stdout and stderr), each under a '--- <task> (<state>) ---' line: GET "
                    "/v1alpha1/jobs/{job_id}/logs on the coordinator at --api.",
    )
    add_job_id(parser)
    parser.add_argument("--task", default=None, metavar="T", help="only this task's log")
    parser.add_argument("--tail", type=whole_number("--tail", 0), default=None, metavar="N", help="only the last N lines of each log")
    parser.add_argument("--follow", "-f", action="store_true",
                        help=f"keep printing new lines (asking every {FOLLOW_POLL_S:g} s) until the job has ended")
    parser.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    add_token_option(parser)
    parser.set_defaults(handler=handle_logs)

    parser = subparsers.add_parser(
        "tasks", help="list a job's tasks: state, node, attempts",
        description="List a job's tasks with their state, the node of their latest lease and the attempts "
                    "used: GET /v1alpha1/jobs/{job_id}/tasks on the coordinator at --api.",
    )
    add_job_id(parser)
    parser.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    add_token_option(parser)
    parser.set_defaults(handler=handle_tasks)

    parser = subparsers.add_parser(
        "goodput", help="a job's goodput ledger: useful vs lost machine time, MTTD and MTTR of each recovery",
        description="Compute a job's goodput ledger from its events (GET /v1alpha1/jobs/{job_id}/events on the "
                    "coordinator at --api): machine time of every attempt (lease), the share of it in attempts "
                    "whose output was accepted, lost work, and for each attempt that failed, expired or was given "
                    "back, the time to detect it (from its last heartbeat) and to claim the task again.",
    )
    add_job_id(parser)
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")
    add_token_option(parser)
    parser.set_defaults(handler=handle_goodput)

    parser = subparsers.add_parser(
        "artifacts", help="list a job's artifacts (--download DIR: fetch them)",
        description="List the files a job's tasks uploaded (key, size, sha256): GET "
                    "/v1alpha1/jobs/{job_id}/artifacts on the coordinator at --api. With --download DIR, "
                    "fetch each into DIR under its path within the job (DIR/<task>/...), check its sha256, "
                    "and refuse any path that would land outside DIR.",
    )
    add_job_id(parser)
    parser.add_argument("--download", default=None, metavar="DIR", help="fetch every artifact into DIR")
    parser.add_argument("--json", action="store_true", help="print the coordinator's listing as JSON")
    add_token_option(parser)
    parser.set_defaults(handler=handle_artifacts)


def _register_jobs(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "jobs", help="list the coordinator's jobs: state, owner, tasks done, age",
        description="List the jobs the token may see, newest first: their id, name, state, who submitted them, "
                    "how many of their tasks are done, and their age (GET /v1alpha1/jobs on the coordinator at "
                    "--api, and each listed job's tasks).",
    )
    parser.add_argument("--state", default=None, metavar="STATE[,STATE]",
                        help="only jobs in these states, e.g. RUNNING or failed,cancelled")
    parser.add_argument("--owner", default=None, metavar="NAME", help="only jobs this submitter submitted")
    parser.add_argument("--limit", type=whole_number("--limit", 1), default=JOB_LIST_LIMIT, metavar="N",
                        help=f"at most N jobs, the newest (default {JOB_LIST_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print the listed job records as JSON")
    add_token_option(parser)
    parser.set_defaults(handler=handle_jobs)


def _command(name: str, body: Callable[[str, CoordinatorClient, argparse.Namespace], int]) -> Callable[
        [argparse.Namespace], int]:
    """A handler: where the coordinator is, then ``body(api, client, args)``; its ``CommandError``
    is printed and its code returned."""
    def handler(args: argparse.Namespace) -> int:
        try:
            api = resolve_api(getattr(args, "api", None))
        except ValueError as exc:
            print(f"flashruntime {name}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        try:
            return body(api, cli_client(api, args), args)
        except CommandError as exc:
            print(f"flashruntime {name}: {exc}", file=sys.stderr)
            return exc.code

    return handler


# --- logs ------------------------------------------------------------------------


def new_text(before: str, now: str) -> str:
    """What ``now`` (a task's log as fetched now) adds to ``before`` (as fetched last time): the
    rest when it extends it; else, the worker having cut the log's start meanwhile, what follows
    the last place ``before``'s final lines appear in it (as many of them as are found, so a
    line that repeats rarely misleads); else (a new attempt's log) all of it."""
    if now.startswith(before):
        return now[len(before):]
    lines = before.splitlines(keepends=True)
    count = min(len(lines), _ANCHOR_LINES)
    while count:
        anchor = "".join(lines[-count:])
        at = now.rfind(anchor)
        if at >= 0:
            return now[at + len(anchor):]
        count //= 2
    return now


def _complete_lines(text: str) -> str:
    return text[:text.rfind("\n") + 1]


class _LogFollower:
    """Prints each task's new complete lines under its header, once; the rest at the end."""

    def __init__(self, tail: int | None, write: Callable[[str], object]) -> None:
        self._seen: dict[str, str] = {}  # task id -> its log up to the last line printed
        self._tail = tail
        self._write = write
        self._current: str | None = None  # the task whose lines were printed last

    def _print(self, entry: Mapping[str, Any], text: str) -> None:
        if not text:
            return
        task_id = str(entry.get("task_id"))
        if task_id != self._current:
            self._write(f"--- {task_id} ({entry.get('state')}) ---\n")
            self._current = task_id
        self._write(text)

    def show(self, answer: Mapping[str, Any], *, final: bool) -> None:
        """Print what ``answer`` (the logs as fetched now) adds; ``final``: the job has ended, so
        a last line without its newline is printed too."""
        for entry in answer.get("tasks") or ():
            task_id, log = str(entry.get("task_id")), str(entry.get("log") or "")
            before = self._seen.get(task_id)
            added = new_text(before or "", log)  # always a suffix of log
            shown = added if final else _complete_lines(added)
            self._seen[task_id] = log[:len(log) - len(added) + len(shown)]
            if before is None and self._tail is not None:
                shown = last_lines(shown, self._tail)  # like tail -n N -f: N lines, then every new one
            if final and shown and not shown.endswith("\n"):
                shown += "\n"
            self._print(entry, shown)


def _logs_body(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    if not args.follow:
        answer = coordinator_call(api, lambda: client.logs(args.job_id, task=args.task, tail=args.tail))
        if args.json:
            print(json.dumps(answer, indent=2))
        else:
            sys.stdout.write(str(answer.get("logs") or ""))
        return EXIT_OK
    try:
        return _follow(api, client, args)
    except KeyboardInterrupt:  # the usual way to stop following: quietly, as tail -f does
        return EXIT_INTERRUPTED


def _follow(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    follower = _LogFollower(args.tail, _writer())
    while True:
        # The state first: a job seen ended had its final logs uploaded before it ended.
        state = str(coordinator_call(api, lambda: client.job(args.job_id)).get("state"))
        answer = coordinator_call(api, lambda: client.logs(args.job_id, task=args.task))
        ended = state in TERMINAL_STATES
        if args.json:
            if ended:
                print(json.dumps(answer, indent=2))
        else:
            follower.show(answer, final=ended)
        if ended:
            print(f"flashruntime logs: job {args.job_id} {state}", file=sys.stderr)
            return EXIT_OK
        time.sleep(FOLLOW_POLL_S)


def _writer() -> Callable[[str], object]:
    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()  # a person is watching

    return write


handle_logs = _command("logs", _logs_body)


# --- tasks -----------------------------------------------------------------------


def _tasks_body(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    rows = coordinator_call(api, lambda: client.tasks(args.job_id))
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print(f"job {args.job_id} has no tasks")
        return EXIT_OK
    sys.stdout.write(table(("TASK", "STATE", "NODE", "ATTEMPTS"), [
        (str(row.get("task_id")), str(row.get("state")), str(row.get("node_id") or "-"),
         f"{row.get('attempts')}/{row.get('max_attempts')}") for row in rows]))
    return EXIT_OK


handle_tasks = _command("tasks", _tasks_body)


# --- jobs ------------------------------------------------------------------------

JOB_LIST_LIMIT = 20


def listed_jobs(records: list[dict[str, Any]], *, states: str | None, owner: str | None,
                limit: int) -> list[dict[str, Any]]:
    """The records ``jobs`` shows: in one of ``states`` (comma-separated, any case) and submitted
    by ``owner`` when given, newest first, at most ``limit``."""
    wanted = {state.strip().upper() for state in states.split(",") if state.strip()} if states else None
    chosen = [record for record in records
              if (wanted is None or str(record.get("state")).upper() in wanted)
              and (owner is None or (record.get("submitted_by") or {}).get("name") == owner)]
    chosen.sort(key=lambda record: str(record.get("created_at") or ""), reverse=True)
    return chosen[:limit]


def _jobs_body(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    records = listed_jobs(coordinator_call(api, client.jobs), states=args.state, owner=args.owner,
                          limit=args.limit)
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        filters = " ".join(part for part in (f"in state {args.state}" if args.state else "",
                                             f"of {args.owner}" if args.owner else "") if part)
        print(f"no jobs{' ' + filters if filters else ''} on {api}")
        return EXIT_OK
    now = datetime.now(timezone.utc)
    rows = []
    for record in records:
        job_id = str(record.get("job_id"))
        tasks = coordinator_call(api, lambda job_id=job_id: client.tasks(job_id))
        done = sum(1 for task in tasks if task.get("state") == "COMPLETED")
        owner = (record.get("submitted_by") or {}).get("name") or "-"
        name = str(((record.get("spec") or {}).get("metadata") or {}).get("name") or "-")
        rows.append((job_id, name, str(record.get("state")), owner, f"{done}/{len(tasks)}",
                     ago(record.get("created_at"), now)))
    sys.stdout.write(table(("JOB", "NAME", "STATE", "OWNER", "TASKS", "AGE"), rows))
    return EXIT_OK


handle_jobs = _command("jobs", _jobs_body)


# --- goodput ---------------------------------------------------------------------


def _goodput_body(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    from flashruntime.goodput.job import job_goodput, job_goodput_lines
    from flashruntime.protocol.v1alpha1 import Event, utcnow

    rows = coordinator_call(api, lambda: client.events(args.job_id))
    job = coordinator_call(api, lambda: client.job(args.job_id))
    events = []
    for row in rows:
        try:
            events.append(Event.model_validate(row))
        except ValueError:
            continue  # an event type newer than this client: not one the ledger reads
    # A finished job's ledger ends with it; a running one's attempts count up to now.
    now = None if str(job.get("state")) in TERMINAL_STATES else utcnow()
    ledger = job_goodput(events, now=now)
    if args.json:
        print(json.dumps(ledger.as_json(), indent=2))
        return EXIT_OK
    print(f"job {args.job_id} ({job.get('state')})")
    print("\n".join(job_goodput_lines(ledger)))
    return EXIT_OK


handle_goodput = _command("goodput", _goodput_body)


# --- artifacts -------------------------------------------------------------------


def _size(size: Any) -> str:
    if not isinstance(size, int):
        return "?"
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else f"{size / (1024 * 1024):.1f} MiB"


def safe_destination(root: Path, job_id: str, key: str) -> Path | None:
    """Where artifact ``key`` of job ``job_id`` goes under ``root``: its path within
    ``jobs/<job_id>/``. None when it would land anywhere but strictly inside ``root``."""
    prefix = f"jobs/{job_id}/"
    if not key.startswith(prefix) or "\\" in key or "\x00" in key:
        return None
    relative = PurePosixPath(key[len(prefix):])
    if not relative.parts or relative.is_absolute() or any(part in ("", ".", "..") for part in relative.parts):
        return None
    target = root.joinpath(*relative.parts)
    resolved_root = root.resolve()
    try:
        target.resolve().relative_to(resolved_root)  # a symlinked directory inside root could lead out
    except ValueError:
        return None
    return target if target.resolve() != resolved_root else None


def _download(client: CoordinatorClient, api: str, key: str, target: Path, expected: Any) -> str:
    """Fetch ``key`` into ``target`` through a temporary file beside it, published only when its
    sha256 matches ``expected`` (unchecked when the coordinator gave none). → what to print."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".download-", dir=target.parent)
    os.close(fd)
    partial = Path(name)
    try:
        size = coordinator_call(api, lambda: client.download(key, partial))
        digest = hashlib.sha256()
        with open(partial, "rb") as handle:
            for block in iter(lambda: handle.read(1024 * 1024), b""):
                digest.update(block)
        actual = digest.hexdigest()
        if isinstance(expected, str) and expected and actual != expected:
            raise CommandError(f"{key}: sha256 {actual} is not the listed {expected}; nothing written",
                               EXIT_HTTP_ERROR)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    check = "sha256 ok" if isinstance(expected, str) and expected else "sha256 not listed by the coordinator"
    return f"{_size(size)}, {check}"


def _artifacts_body(api: str, client: CoordinatorClient, args: argparse.Namespace) -> int:
    listing = coordinator_call(api, lambda: client.job_artifacts(args.job_id))
    if args.download is None:
        if args.json:
            print(json.dumps(listing, indent=2))
        elif not listing:
            print(f"job {args.job_id} has no artifacts")
        else:
            sys.stdout.write(table(("KEY", "SIZE", "SHA256"), [
                (str(item.get("key")), _size(item.get("size_bytes")), str(item.get("sha256") or "-"))
                for item in listing]))
        return EXIT_OK
    root = Path(args.download).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot use {str(root)!r} as the download directory: {exc.strerror or exc}",
                           EXIT_HTTP_ERROR) from None
    problems = 0
    for number, item in enumerate(listing, start=1):
        key = str(item.get("key"))
        where = f"[{number}/{len(listing)}] {key}"
        target = safe_destination(root, args.job_id, key)
        if target is None:
            print(f"flashruntime artifacts: {where}: refused: its path would land outside {root}", file=sys.stderr)
            problems += 1
            continue
        try:
            done = _download(client, api, key, target, item.get("sha256"))
        except CommandError as exc:
            if exc.code == EXIT_UNREACHABLE:
                raise
            print(f"flashruntime artifacts: {where}: {exc}", file=sys.stderr)
            problems += 1
            continue
        except OSError as exc:
            print(f"flashruntime artifacts: {where}: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
            problems += 1
            continue
        print(f"{where} -> {target} ({done})", flush=True)
    if problems:
        print(f"flashruntime artifacts: {problems} of {len(listing)} files not downloaded", file=sys.stderr)
        return EXIT_HTTP_ERROR
    if not listing:
        print(f"job {args.job_id} has no artifacts")
    return EXIT_OK


handle_artifacts = _command("artifacts", _artifacts_body)

