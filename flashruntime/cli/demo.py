"""``flashruntime demo``: the bundled trainer through flash.submit with an injected
crash after the first checkpoint — shows classification, the recovery decision and
the resume step. Needs only the core install (``--ddp`` needs torch)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

SHOWN_EVENTS = ("LAUNCH_STARTED", "ATTEMPT_FINISHED", "FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED",
                "RESUME_SELECTED", "RUN_CANCELLED", "LAUNCH_FAILED")
STEPS, CHECKPOINT_EVERY, CRASH_AT = 60, 10, 25


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="see a crash, the recovery decision and the resume, in seconds",
        description="Train a tiny model (the core install is enough; --ddp uses torch on 2 CPU ranks), crash "
                    "it on purpose, and watch the recovery: the failure's class, the decision, the relaunch "
                    "resuming from the last verified checkpoint.")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a new directory under the runs root; see `flashruntime runs`)")
    parser.add_argument("--ddp", action="store_true", help="train with torch DDP on 2 CPU ranks (needs torch)")
    parser.add_argument("--no-crash", action="store_true", help="do not inject the crash")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


def demo_workload(ddp: bool, crash: bool) -> Any:
    from flashruntime.workloads.command import CommandWorkload, OutputSpec

    crash_args = [f"--crash-at-step={CRASH_AT}"] if crash else []
    script = str(Path(__file__).resolve().parents[1] / "demo" / ("train_ddp.py" if ddp else "train.py"))
    if ddp:
        argv = ["torchrun", "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1", script]
    else:
        argv = [sys.executable, script]
    argv += [f"--steps={STEPS}", f"--checkpoint-every={CHECKPOINT_EVERY}", *crash_args]
    # The DDP demo is 2 CPU ranks on gloo: with GPUs visible, prepare() would put rank N on cuda:N.
    env = {"CUDA_VISIBLE_DEVICES": ""} if ddp else {}
    return CommandWorkload(command=argv, mode="coordinated" if ddp else "local", env=env,
                           outputs=OutputSpec(collect=[], primary_metric="final_loss", maximize=False))


def handle(args: argparse.Namespace) -> int:
    from flashruntime.local.submit import submit

    if args.ddp:
        import importlib.util

        try:
            has_torch = importlib.util.find_spec("torch") is not None
        except ImportError:  # a broken or blocked install counts as absent
            has_torch = False
        if not has_torch or shutil.which("torchrun") is None:
            print("error: --ddp needs PyTorch: pip install torch", file=sys.stderr)
            return 1
    if args.output_dir is not None:
        earlier = Path(args.output_dir).expanduser() / "run.json"
        if earlier.exists():  # its checkpoints would be resumed from: nothing would crash or recover
            print(f"error: {earlier.parent} already holds a run (run.json), and the demo would resume from its "
                  "checkpoints instead of showing a crash and its recovery; pass a new --output-dir, or none "
                  "for a new one", file=sys.stderr)
            return 1
    crash = not args.no_crash
    run = submit(demo_workload(args.ddp, crash), output_dir=args.output_dir, max_restarts=2, watch=False,
                 quiet=True)
    events = [e for e in run.events if e["type"] in SHOWN_EVENTS]
    recovered = any(e["type"] == "RESUME_SELECTED" for e in events)
    ok = str(run.state) == "SUCCEEDED" and (recovered or not crash)
    trial = run.trials[-1] if run.trials else None
    if args.json:
        print(json.dumps({"ok": ok, "state": str(run.state), "events": events, "trial": trial,
                          "output_dir": str(run.output_dir)}, default=str))
        return 0 if ok else 1
    print(f"flashruntime demo: a training run checkpointing every {CHECKPOINT_EVERY} steps"
          + (f", killed at step {CRASH_AT}" if crash else " (no crash injected)"))
    for event in events:
        print(f"  {event['type']:<25} {event['message']}")
    if trial:
        print(f"trial: final_loss={trial.get('final_loss'):.6f} after {trial.get('steps')} steps "
              f"(last attempt started from step {trial.get('started_from_step')})")
    print(f"state: {run.state}")
    print(f"output: {run.output_dir}")
    if not ok:
        print("demo FAILED: see the attempt logs under the output dir", file=sys.stderr)
    return 0 if ok else 1
