"""``flashruntime submit CMD``: flash.submit from a shell, with a live progress line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_PARAMS = 0, 1, 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "submit", help="run a command with checkpoints, recovery and output collection",
        description="Run CMD locally (never through a shell) with flash.submit.",
    )
    parser.add_argument("cmd", metavar="CMD", help='the command, e.g. "python train.py --lr 0.1"')
    parser.add_argument("--source", default=".", help="source directory the command runs in (default .)")
    parser.add_argument("--task-params", default=None,
                        help='JSON list of objects; fans out one trial per object, e.g. \'[{"lr": 0.1}]\'')
    parser.add_argument("--max-restarts", type=int, default=0, help="relaunches allowed after a failure (default 0)")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a new temporary directory)")
    watch = parser.add_mutually_exclusive_group()
    watch.add_argument("--watch", dest="watch", action="store_true", default=None, help="open the live run page")
    watch.add_argument("--no-watch", dest="watch", action="store_false", help="do not open the live run page")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    parser.set_defaults(handler=handle)


def parse_task_params(raw: str | None) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError("--task-params must be a JSON list of objects, e.g. '[{\"lr\": 0.1}, {\"lr\": 0.01}]'")
    return value


# The launcher's advice names the SDK's Source(path=...); this command sets it with --source.
_SDK_ADVICE, _CLI_ADVICE = "set Source(path=...) to your project", "point --source at your project directory"


def in_cli_terms(message: str) -> str:
    """``message`` with the SDK's advice replaced by this command's flag."""
    return message.replace(_SDK_ADVICE, _CLI_ADVICE)


def summary(run: Any) -> dict[str, Any]:
    best = None
    if run.workload.outputs.primary_metric:
        best = run.best_trial()
    return {"state": str(run.state), "trials": len(run.trials), "best": best,
            "output_dir": str(run.output_dir), "viewer_url": run.viewer_url}


def handle(args: argparse.Namespace) -> int:
    from flashruntime.cli._progress import watch
    from flashruntime.errors import LaunchError
    from flashruntime.local.submit import submit
    from flashruntime.workloads.command import CommandWorkload, Source

    try:
        task_params = parse_task_params(args.task_params)
    except ValueError as exc:
        print(f"error: invalid --task-params: {exc}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    workload = CommandWorkload(command=args.cmd, source=Source(path=args.source), task_params=task_params)
    # --json promises one JSON object on stdout: what submit itself prints (the viewer's
    # address) goes to stderr then.
    printed = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with printed:
            run = submit(workload, output_dir=args.output_dir, wait=False, max_restarts=args.max_restarts,
                         watch=args.watch)
        if sys.stderr.isatty() and not args.json:
            watch(run, sys.stderr)
        run.wait()
    except (LaunchError, ValueError) as exc:
        print(f"error: {in_cli_terms(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        run.cancel()
        run.wait()
    if run.events and run.events[-1]["type"] == "LAUNCH_FAILED":
        print(f"error: {in_cli_terms(run.events[-1]['message'])}", file=sys.stderr)
    result = summary(run)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(f"state: {result['state']}")
        print(f"trials: {result['trials']}")
        if run.workload.outputs.primary_metric:
            print(f"best: {json.dumps(result['best'], default=str)}")
        print(f"output: {result['output_dir']}")
    return EXIT_OK if result["state"] == "SUCCEEDED" else EXIT_FAILED
