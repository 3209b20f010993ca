"""trial_storm: 16 trials, every other one armed to crash once, max_restarts=1 —
how many complete, how many auto-resumed, how many would need a human."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import MANUAL_INTERVENTIONS, trials_completed

NAME, SECTION = "trial_storm", "resilience"
TRIALS, STEPS, EVERY = 16, 20, 5



def _storm(work: Path) -> dict[str, float]:
    from benchmarks.faults import write_crashy_trainer
    from flashruntime.sdk import submit
    from flashruntime.workloads.command import CommandWorkload, OutputSpec

    crashy = write_crashy_trainer(work / "crashy", STEPS, EVERY, "systemexit_mid")
    steady = write_crashy_trainer(work / "steady", STEPS, EVERY, None)
    params = [{"script": str(crashy if i % 2 else steady), "i": i} for i in range(TRIALS)]
    workload = CommandWorkload(command=[sys.executable, "{script}"], task_params=params,
                               outputs=OutputSpec(collect=[], primary_metric="final_value"))
    run = submit(workload, output_dir=work / "out", max_restarts=1, watch=False)
    completed = sum(1 for t in run.trials if "final_value" in t)
    resumed = sum(1 for e in run.events if e["type"] == "RESUME_SELECTED" and "resumes from step" in e["message"])
    recomputed = total = 0
    for index in range(TRIALS):
        job_dir = work / "out" / f"local-{index:03d}"
        attempts = sorted(job_dir.glob("task-*"), key=lambda p: (len(p.name), p.name))
        seen: set[int] = set()
        for attempt in attempts:
            path = attempt / "metrics.jsonl"
            steps = [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.exists() else []
            recomputed += len(seen & set(steps))
            seen |= set(steps)
        total += len(seen)
    return {"completed": completed, "resumed": resumed, "manual": TRIALS - completed,
            "recompute": recomputed / total if total else 0.0}


def run(repeats: int, smoke: bool) -> list[dict]:
    samples = 1 if smoke else max(3, repeats)
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    results = []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            results.append(_storm(Path(tmp)))
    note = [f"{TRIALS} trials, {TRIALS // 2} armed to exit mid-run once, max_restarts=1, {STEPS} steps, "
            f"checkpoint every {EVERY}"]
    return [
        measured_row(NAME, SECTION, "trials_completed", f"of {TRIALS}", [r["completed"] for r in results],
                     target=trials_completed(TRIALS), notes=note),
        measured_row(NAME, SECTION, "trials_auto_resumed", f"of {TRIALS // 2} crashed",
                     [r["resumed"] for r in results], notes=note),
        measured_row(NAME, SECTION, "manual_interventions", "trials", [r["manual"] for r in results],
                     target=MANUAL_INTERVENTIONS, notes=note),
        measured_row(NAME, SECTION, "recompute_fraction", "fraction of steps", [r["recompute"] for r in results],
                     notes=note),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a sweep where half the trials crash once completes every trial without a human",
    section=SECTION,
    run=run,
)
