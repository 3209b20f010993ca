"""auto_resume: a run killed mid-training resumes from its last valid checkpoint;
counts the steps it did not recompute, against a rerun from zero (the same crash
with checkpointing off)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row

NAME, SECTION = "auto_resume", "performance"
STEPS, EVERY = 40, 10  # the crash (SystemExit) lands at STEPS // 2 = 20, right after the step-20 checkpoint


def _steps_computed(out: Path) -> list[list[int]]:
    """Per attempt, the steps its metrics.jsonl recorded."""
    attempts = []
    for attempt_dir in sorted((out / "local").glob("task-*"), key=lambda p: (len(p.name), p.name)):
        lines = (attempt_dir / "metrics.jsonl").read_text().splitlines() if (attempt_dir / "metrics.jsonl").exists() else []
        attempts.append([json.loads(line)["step"] for line in lines if line.strip()])
    return attempts


def _crash_and_resume(work: Path, every: int) -> tuple[int, int, str]:
    """(steps not recomputed, steps recomputed, final state) of one crash + auto-resume."""
    from benchmarks.faults import write_crashy_trainer
    from flashruntime.sdk import submit
    from flashruntime.workloads.command import CommandWorkload

    script = write_crashy_trainer(work / "src", STEPS, every, "systemexit_mid")
    run = submit(CommandWorkload(command=[sys.executable, str(script)]), output_dir=work / "out",
                 max_restarts=1, watch=False)
    attempts = _steps_computed(work / "out")
    done_before_crash = set(attempts[0]) if attempts else set()
    redone = set(attempts[1]) & done_before_crash if len(attempts) > 1 else set()
    return len(done_before_crash - redone), len(redone), str(run.state)


def run(repeats: int, smoke: bool) -> list[dict]:
    samples = 1 if smoke else max(3, repeats)
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    saved, recomputed_ours, recomputed_zero, states = [], [], [], set()
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            kept, redone, state = _crash_and_resume(Path(tmp), EVERY)
            saved.append(float(kept))
            recomputed_ours.append(redone / STEPS)
            states.add(state)
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            _, redone_zero, state = _crash_and_resume(Path(tmp), 0)
            recomputed_zero.append(redone_zero / STEPS)
            states.add(state)
    notes = [f"{STEPS} steps, checkpoint every {EVERY}, crash at step {STEPS // 2}; final states {sorted(states)}"]
    return [
        measured_row(NAME, SECTION, "steps_not_recomputed", "steps", saved, notes=notes),
        measured_row(NAME, SECTION, "recompute_fraction", "fraction of steps", recomputed_ours,
                     comparator=("rerun from zero", recomputed_zero), notes=notes),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a crashed run resumes from its last valid checkpoint instead of recomputing from zero",
    section=SECTION,
    run=run,
)
