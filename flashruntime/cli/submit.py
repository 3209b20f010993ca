"""``flashruntime submit CMD``: flash.submit from a shell. The job's output streams to the
terminal as it runs; a failed run ends with its failure summary; a sweep ends with its
table of trials, best first."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from flashruntime.cli._api import API_ENV, TOKEN_HELP, resolve_api
from flashruntime.cli._arguments import whole_number
from flashruntime.cli.trial_table import trial_table_text

EXIT_OK, EXIT_FAILED, EXIT_BAD_PARAMS = 0, 1, 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "submit", help="run a command with checkpoints, recovery and output collection",
        description="Run CMD locally (never through a shell) with flash.submit, or with --api on the "
                    "coordinator's workers. Its output streams to the terminal as it runs; a failed run ends with "
                    "what failed and why.",
    )
    parser.add_argument("cmd", metavar="CMD", help='the command, e.g. "python train.py --lr 0.1"')
    parser.add_argument("--source", default=".", help="source directory the command runs in (default .)")
    parser.add_argument("--task-params", default=None,
                        help='JSON list of objects; fans out one trial per object, e.g. \'[{"lr": 0.1}]\'')
    parser.add_argument("--checkpoint-glob", action="append", default=None, metavar="PATTERN",
                        help="a checkpoint the script keeps itself, as a glob relative to its working directory "
                             "(e.g. snapshot.pt; repeatable); Hugging Face, Lightning, accelerate and DCP "
                             "checkpoints are recognised without it")
    parser.add_argument("--metric", default=None,
                        help="the metrics.json key that ranks a sweep's trials, e.g. loss")
    parser.add_argument("--mode", choices=("min", "max"), default=None,
                        help="whether the best trial has the lowest (min) or highest (max) --metric; default: min for a "
                             "metric named like a cost (loss, error, time), else max")
    parser.add_argument("--parallel", type=whole_number("--parallel", 1), default=None, metavar="N",
                        help="run up to N trials of a sweep at once (default: one after another; with --executor "
                             "ray, as many as the cluster has CPUs)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where attempts run: local processes (default), or Ray tasks (needs the ray extra)")
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS",
                        help="with --executor ray: local, auto, ray://host:port or host:port (default: "
                             "FLASHML_RAY_ADDRESS, else an embedded local Ray)")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop the sweep at the first failed trial (default: run every trial)")
    parser.add_argument("--max-restarts", type=int, default=0, help="relaunches allowed after a failure (default 0)")
    parser.add_argument("--ranks", default=None, metavar="MIN:MAX",
                        help="run elastic: each attempt starts with the ranks available, up to MAX, and a rank lost "
                             "for good costs a relaunch on those left, down to MIN (torchrun or python commands)")
    parser.add_argument("--output-dir", default=None,
                        help="run directory (default: a new directory under the runs root; see `flashruntime runs`)")
    watch = parser.add_mutually_exclusive_group()
    watch.add_argument("--watch", dest="watch", action="store_true", default=None, help="open the live run page")
    watch.add_argument("--no-watch", dest="watch", action="store_false", help="do not open the live run page")
    parser.add_argument("--quiet", action="store_true",
                        help="do not stream the job's output and progress (the summary is still printed)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the summary (the job's output goes to stderr)")
    parser.add_argument("--tensorboard", default=None, metavar="DIR",
                        help="when the run ends, write its metrics and every trial's as TensorBoard event files "
                             "under DIR/<run> (default: $FLASHML_TENSORBOARD_DIR; needs the tensorboard extra)")
    parser.add_argument("--mlflow", default=None, metavar="URI",
                        help="when the run ends, log it to the MLflow tracking store at URI (a sweep: a parent run "
                             "with one run per trial), in $MLFLOW_EXPERIMENT_NAME, else 'flashruntime' (default: "
                             "$MLFLOW_TRACKING_URI; needs the mlflow extra)")
    fleet = parser.add_argument_group("on the fleet: with --api URL (or env FLASHML_RUNTIME_API), CMD runs as a "
                                      "command job on the coordinator's workers, in an upload of --source")
    fleet.add_argument("--api", default=argparse.SUPPRESS, metavar="URL",
                       help="submit to the coordinator at URL instead of running here (also accepted before submit)")
    fleet.add_argument("--token", default=argparse.SUPPRESS, help=TOKEN_HELP)
    fleet.add_argument("--pool", default=None, metavar="POOL",
                       help="run on the --runner trusted workers of this team pool (the sandbox waiver, accepted "
                            "only inside a pool); default: workers whose sandbox runs the command")
    fleet.add_argument("--local", action="store_true", help="run here even when FLASHML_RUNTIME_API is set")
    parser.set_defaults(handler=handle)


def parse_task_params(raw: str | None) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError("expected a JSON list of objects, e.g. '[{\"lr\": 0.1}, {\"lr\": 0.01}]'")
    return value


# The launcher's advice names the SDK's Source(path=...); this command sets it with --source.
_SDK_ADVICE, _CLI_ADVICE = "set Source(path=...) to your project", "point --source at your project directory"


def in_cli_terms(message: str) -> str:
    """``message`` with the SDK's advice replaced by this command's flag."""
    return message.replace(_SDK_ADVICE, _CLI_ADVICE)


def summary(run: Any) -> dict[str, Any]:
    best = run.best_trial() if run.metric else None
    return {"state": str(run.state), "trials": len(run.trials), "best": best,
            "output_dir": str(run.output_dir), "viewer_url": run.viewer_url,
            "metric": run.metric, "mode": run.mode if run.metric else None, "table": run.trial_table(),
            "failure": run.failure_summary()}


def _fleet_api(args: argparse.Namespace) -> str | int | None:
    """The coordinator to submit to (None: run here), or the exit code of a refusal, printed."""
    from flashruntime.cli.fleet_submit import refused_flags

    given = getattr(args, "api", None)
    if args.local and given is not None:
        print("error: --local and --api contradict each other: drop one", file=sys.stderr)
        return EXIT_BAD_PARAMS
    if args.local or (given is None and not os.environ.get(API_ENV)):
        if args.pool is not None:
            print("error: --pool names the team pool of a coordinator's workers; it needs --api URL (or "
                  f"{API_ENV}), or drop --pool to run here", file=sys.stderr)
            return EXIT_BAD_PARAMS
        return None
    try:
        api = resolve_api(given)  # --api, else the environment's
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    problem = refused_flags(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    return api


def handle(args: argparse.Namespace) -> int:
    from flashruntime.cli._progress import Terminal, watch
    from flashruntime.errors import LaunchError, ModuleUnavailable
    from flashruntime.local.submit import submit
    from flashruntime.workloads.command import CommandWorkload, Source, unfilled_placeholders

    try:
        task_params = parse_task_params(args.task_params)
    except ValueError as exc:
        print(f"error: invalid --task-params: {exc}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    workload = CommandWorkload(command=args.cmd, source=Source(path=args.source), task_params=task_params)
    fleet = _fleet_api(args)
    if isinstance(fleet, int):
        return fleet
    unfilled = unfilled_placeholders(workload)
    if unfilled:
        example = ", ".join(f'"{name[1:-1]}": 0.1' for name in unfilled[:2])
        print(f"warning: the command has the placeholder{'s' if len(unfilled) > 1 else ''} {' '.join(unfilled)} "
              f"but no --task-params to fill {'them' if len(unfilled) > 1 else 'it'}, so it runs as written; to "
              f"sweep, add --task-params '[{{{example}}}]'", file=sys.stderr)
    # --json promises one JSON object on stdout: the job's output, and what submit itself
    # prints (the viewer's address), go to stderr then.
    lines = sys.stderr if args.json else sys.stdout
    if fleet is not None:
        from flashruntime.cli.fleet_submit import submit_to_fleet

        return submit_to_fleet(args, workload, fleet, lines)
    status = sys.stderr if sys.stderr.isatty() and not args.quiet else None
    terminal = Terminal(lines, status)
    printed = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    run = None
    try:
        with printed:
            run = submit(workload, output_dir=args.output_dir, wait=False, max_restarts=args.max_restarts,
                         watch=args.watch, checkpoints=args.checkpoint_glob, metric=args.metric, mode=args.mode,
                         max_concurrent_trials=args.parallel, fail_fast=args.fail_fast,
                         quiet=args.quiet, stream=terminal, executor=args.executor, ray_address=args.ray_address,
                         tensorboard_dir=args.tensorboard, mlflow_uri=args.mlflow, ranks=args.ranks)
        if status is not None:
            watch(run, terminal)
        run.wait()
    except (LaunchError, ValueError, ModuleUnavailable) as exc:
        print(f"error: {in_cli_terms(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        if run is None:
            raise
        run.cancel()
        run.wait()
    result = summary(run)
    if result["failure"]:
        print(in_cli_terms(result["failure"]), file=sys.stderr)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        if result["table"]:
            print(trial_table_text(result["table"], run.metric))
        print(f"state: {result['state']}")
        print(f"trials: {result['trials']}")
        if run.metric:
            print(f"best: {json.dumps(result['best'], default=str)}")
        print(f"output: {result['output_dir']}")
    return EXIT_OK if result["state"] == "SUCCEEDED" else EXIT_FAILED
