"""``flashruntime chaos CMD``: run CMD with faults injected on purpose, then the same
command without them, and report what the run did: detection and recovery times, steps
recomputed, goodput, and whether the result is the fault-free one."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_ARGUMENTS = 0, 1, 2


def _step(text: str) -> dict[str, Any]:
    """``N`` or ``LOW-HIGH`` (a random step in that range, drawn with --seed)."""
    low, dash, high = text.partition("-")
    try:
        if dash:
            return {"between": (int(low), int(high))}
        return {"at_step": int(text)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"a step is N or LOW-HIGH, got {text!r}") from None


def _rank_at(text: str) -> dict[str, Any]:
    rank, at, step = text.partition("@")
    if not at:
        raise argparse.ArgumentTypeError(f"expected RANK@STEP, e.g. 1@30, got {text!r}")
    try:
        return {"rank": int(rank), **_step(step)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK@STEP, e.g. 1@30, got {text!r}") from None


def _with_seconds(parse: Any) -> Any:
    def parse_with_seconds(text: str) -> dict[str, Any]:
        head, colon, seconds = text.rpartition(":")
        if not colon:
            raise argparse.ArgumentTypeError(f"expected ...:SECONDS, e.g. 1@30:5, got {text!r}")
        try:
            return {**parse(head), "seconds": float(seconds)}
        except ValueError:
            raise argparse.ArgumentTypeError(f"SECONDS must be a number, got {seconds!r}") from None

    return parse_with_seconds


def _rank_at_for(text: str) -> dict[str, Any]:
    """RANK@STEP, or RANK@STEP:SECONDS."""
    return _with_seconds(_rank_at)(text) if ":" in text else _rank_at(text)


def _step_grace(text: str) -> dict[str, Any]:
    """``STEP`` or ``STEP:GRACE`` (seconds; else ``$FLASHML_PREEMPT_GRACE_S``, else 25)."""
    head, colon, grace = text.rpartition(":")
    if not colon:
        return {**_step(text), "seconds": _default_grace()}
    try:
        seconds = float(grace)
    except ValueError:
        raise argparse.ArgumentTypeError(f"GRACE must be a number of seconds, got {grace!r}") from None
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"GRACE must be more than 0 and at most 3600 seconds, got {grace!r}")
    return {**_step(head), "seconds": seconds}


def _default_grace() -> float:
    from flashruntime.recovery.preemption import DEFAULT_GRACE_S, preempt_settings

    try:
        return preempt_settings(os.environ).grace_s or DEFAULT_GRACE_S
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "chaos", help="run a command with faults injected on purpose, and report how it recovered",
        description="Run CMD (as `flashruntime submit` does) while injecting faults, then run it again without "
                    "them, and report detection time (MTTD), recovery time (MTTR), steps recomputed, goodput and "
                    "whether the result equals the fault-free one. A STEP is N, or LOW-HIGH for a random step "
                    "drawn with --seed. Steps and ranks come from the torch helper (flashruntime.torch), else "
                    "from the checkpoints the script saves itself and the RANK each process was started with. "
                    "Exit 1 when the run failed, its result differs, or a fault could not be injected.",
    )
    parser.add_argument("cmd", metavar="CMD", help='the command, e.g. "torchrun --nproc-per-node 2 train.py"')
    parser.add_argument("--kill-rank", type=_rank_at, action="append", default=[], metavar="RANK@STEP",
                        help="SIGKILL that rank when the run reaches STEP")
    parser.add_argument("--lose-rank", type=_rank_at_for, action="append", default=[],
                        metavar="RANK@STEP[:SECONDS]",
                        help="SIGKILL a rank and take its slot away (for SECONDS, else for good); needs --ranks; "
                             "below MIN the relaunch waits for a slot that returns")
    parser.add_argument("--ranks", default=None, metavar="MIN:MAX",
                        help="run elastic: each relaunch has the ranks available, from MIN to MAX")
    parser.add_argument("--kill-attempt", type=_step, action="append", default=[], metavar="STEP",
                        help="SIGKILL the whole attempt (torchrun, or the command) at STEP, as a lost machine")
    parser.add_argument("--hang-rank", type=_with_seconds(_rank_at), action="append", default=[],
                        metavar="RANK@STEP:SECONDS", help="stop that rank for SECONDS at STEP")
    parser.add_argument("--hang-forever", type=_rank_at, action="append", default=[], metavar="RANK@STEP",
                        help="stop that rank at STEP until the hang watch detects it (see --hang-timeout)")
    parser.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                        help="seconds without progress that make a hang (default: $FLASHML_HANG_TIMEOUT_S, else "
                             "max(10 x the median step time, 60 s); 0: no hang watch)")
    parser.add_argument("--preempt", type=_step_grace, action="append", default=[], metavar="STEP[:GRACE]",
                        help="send the ranks the preemption notice at STEP with GRACE seconds to save (default: "
                             "$FLASHML_PREEMPT_GRACE_S, else 25), as a spot reclaim would; the attempt is "
                             "relaunched without spending a restart")
    parser.add_argument("--slow", type=_with_seconds(_step), action="append", default=[], metavar="STEP:SECONDS",
                        help="stop every rank half of each 200 ms for SECONDS from STEP")
    parser.add_argument("--corrupt-checkpoint", type=_step, action="append", default=[], metavar="STEP",
                        help="at STEP, corrupt a part of the newest valid checkpoint (before a kill at the same step)")
    parser.add_argument("--seed", type=int, default=0, help="draws the random steps (default 0)")
    parser.add_argument("--max-restarts", type=int, default=2, help="relaunches allowed (default 2)")
    parser.add_argument("--metric", default=None,
                        help="the metrics.json key to compare with the fault-free run (default: every float)")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="largest difference called equal (1e-6)")
    parser.add_argument("--no-compare", action="store_true", help="skip the fault-free run")
    parser.add_argument("--source", default=".", help="source directory the command runs in (default .)")
    parser.add_argument("--output-dir", default=None,
                        help="where both runs go, as DIR/chaos and DIR/reference (default: two new run directories)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the runs' output")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(handler=handle)


def _plan(args: argparse.Namespace) -> Any:
    from flashruntime.local.chaos import ChaosPlan, Fault

    # Corruption first: a kill at the same step must find the checkpoint already corrupted.
    faults = [Fault(kind="corrupt_checkpoint", **f) for f in args.corrupt_checkpoint]
    faults += [Fault(kind="kill_rank", **f) for f in args.kill_rank]
    faults += [Fault(kind="lose_rank", **f) for f in args.lose_rank]
    faults += [Fault(kind="kill_attempt", **f) for f in args.kill_attempt]
    faults += [Fault(kind="hang_rank", **f) for f in args.hang_rank]
    faults += [Fault(kind="hang_forever", **f) for f in args.hang_forever]
    faults += [Fault(kind="slow", **f) for f in args.slow]
    faults += [Fault(kind="preempt", **f) for f in args.preempt]
    return ChaosPlan(faults=faults, seed=args.seed)


def handle(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from flashruntime.errors import LaunchError
    from flashruntime.local.chaos import compare_results, render_report
    from flashruntime.local.trial_workdir import link_source_view
    from flashruntime.local.submit import submit
    from flashruntime.workloads.command import CommandWorkload, Source

    try:
        plan = _plan(args)
    except ValidationError as exc:
        problems = "; ".join(error["msg"] for error in exc.errors())
        print(f"error: {problems or 'give at least one fault, e.g. --kill-rank 1@30'}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    workload = CommandWorkload(command=args.cmd, source=Source(path=args.source))
    base = None if args.output_dir is None else Path(args.output_dir)
    stream = sys.stderr if args.json else sys.stdout
    pristine: Path | None = None
    try:
        if not args.no_compare:
            # The fault-free run must not find what the chaos run leaves (a script that resumes
            # itself would resume from it): it runs in a view of the project as it is now.
            pristine = Path(tempfile.mkdtemp(prefix="flashruntime-chaos-reference-"))
            link_source_view(Path(os.path.expanduser(args.source)), pristine / "project", workload.outputs.collect)
        run = submit(workload, output_dir=None if base is None else base / "chaos", max_restarts=args.max_restarts,
                     watch=False, chaos=plan, quiet=args.quiet, stream=stream, hang_timeout_s=args.hang_timeout,
                     ranks=args.ranks)
        reference = None
        if pristine is not None:
            print("flashruntime: the same command without faults, to compare results ...", file=sys.stderr)
            untouched = workload.model_copy(update={"source": Source(path=str(pristine / "project"))})
            reference = submit(untouched, output_dir=None if base is None else base / "reference", watch=False,
                               quiet=True, max_restarts=args.max_restarts, hang_timeout_s=args.hang_timeout,
                               ranks=args.ranks)
    except (LaunchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if pristine is not None:
            shutil.rmtree(pristine, ignore_errors=True)  # links and what the reference run made: never followed
    document = json.loads(run.run_json_path.read_text())
    chaos = document.get("chaos") or {}
    injected = chaos.get("injected") or []
    fired = {(i["kind"], i["step"]) for i in injected}
    not_reached = [{"kind": fault["kind"], "step": step}
                   for fault, step in zip(chaos.get("plan", {}).get("faults", []), chaos.get("steps", []))
                   if (fault["kind"], step) not in fired]
    result = None
    if reference is not None:
        result = compare_results(run.trials[-1] if run.trials else None,
                                 reference.trials[-1] if reference.trials else None,
                                 metric=args.metric, tolerance=args.tolerance)
    report = {
        "run_dir": str(run.output_dir), "reference_dir": None if reference is None else str(reference.output_dir),
        "state": str(run.state), "faults": injected, "not_reached": not_reached,
        "goodput": run.goodput().as_json(), "result": result, "tolerance": args.tolerance,
    }
    if run.failure_summary():
        print(run.failure_summary(), file=sys.stderr)
    print(json.dumps(report, default=str) if args.json else render_report(report))
    # A fault that never fired tested nothing: the run says nothing about surviving it.
    all_fired = not not_reached and all(injection.get("done") for injection in injected)
    ok = str(run.state) == "SUCCEEDED" and (result is None or result["equal"]) and all_fired
    return EXIT_OK if ok else EXIT_FAILED
