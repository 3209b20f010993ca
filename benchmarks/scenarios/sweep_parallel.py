"""sweep_parallel: ``flashruntime submit --parallel 2`` of a 4-trial sweep against the same
sweep with ``--parallel 1``, whole process each, paired in ABBA order. Each trial sleeps,
so the two cores of the reference host never limit how many run at once: the ratio shows
what the drive loop and the live output cost when trials overlap."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import SWEEP_PARALLEL_OVER_SERIAL

NAME, SECTION = "sweep_parallel", "performance"
TRIALS = 4
MIN_PAIRS = 3
FULL_TRIAL_S, SMOKE_TRIAL_S = 3.0, 0.5

TRIAL = """
import json, os, sys, time
time.sleep(float(sys.argv[2]))
with open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w") as f:
    json.dump({"score": float(sys.argv[1])}, f)
"""


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[3:6]} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def run(repeats: int, smoke: bool) -> list[dict]:
    pairs = 1 if smoke else max(MIN_PAIRS, repeats)
    trial_s = SMOKE_TRIAL_S if smoke else FULL_TRIAL_S
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHML_")}
    env["CI"] = env.get("CI", "1")  # no viewer, no browser
    params = json.dumps([{"score": n} for n in range(TRIALS)])
    serial_s, parallel_s = [], []
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        source = Path(tmp)
        (source / "trial.py").write_text(TRIAL)
        for index in range(pairs):
            order = (1, 2) if index % 2 == 0 else (2, 1)  # ABBA
            for parallel in order:
                argv = [sys.executable, "-m", "flashruntime.cli", "submit", "--no-watch", "--metric", "score",
                        "--mode", "max", "--parallel", str(parallel), "--task-params", params,
                        "--output-dir", str(source / f"run-{index}-{parallel}"),
                        f"{sys.executable} trial.py {{score}} {trial_s}"]
                (serial_s if parallel == 1 else parallel_s).append(_time(argv, env, source))
    ratios = [p / s for p, s in zip(parallel_s, serial_s)]
    notes = [f"{pairs} pairs ABBA; per-pair ratio min {min(ratios):.3f}, max {max(ratios):.3f}",
             f"{TRIALS} trials of {trial_s} s of sleep each; live output on, viewer off"]
    return [
        measured_row(NAME, SECTION, "parallel_2_vs_1", "s", parallel_s, comparator=("--parallel 1", serial_s),
                     ratio=statistics.median(ratios), target=SWEEP_PARALLEL_OVER_SERIAL, notes=notes),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="--parallel 2 finishes a 4-trial sweep of light trials in at most 0.6x the wall time of --parallel 1",
    section=SECTION,
    run=run,
)
