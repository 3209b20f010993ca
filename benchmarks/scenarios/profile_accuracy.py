"""profile_accuracy: the step time ``LocalProfiler`` measures in a few steps of the 2-rank
DDP example, against the same script's steady-state step time in a normal run, paired in
ABBA order.

Normal run: ``torchrun`` of ``examples/ddp_train.py`` (2 ranks, gloo) to its end; its
steady-state step time is the median gap between consecutive ``ts`` stamps of
``metrics.jsonl`` after the first five steps. Profile: ``LocalProfiler`` on the same
command, 3 warm-up + 10 measured steps. The row's figure is |profiled ÷ normal − 1| per
pair, judged on the largest.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.targets import PROFILED_STEP_ERROR

NAME, SECTION = "profile_accuracy", "performance"
REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "examples" / "ddp_train.py"
MIN_PAIRS = 3
FULL_ARGS = ["--steps", "80", "--checkpoint-every", "20", "--sleep-per-step", "0.05"]
SMOKE_ARGS = ["--steps", "20", "--checkpoint-every", "10", "--sleep-per-step", "0.05"]
WARMUP, MEASURED = 3, 10
SKIPPED_HEAD = 5  # steps of a normal run counted as start-up, not steady state


def _command(script_args: list[str]) -> list[str]:
    return ["torchrun", "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
            str(SCRIPT), *script_args]


def _normal_step_s(script_args: list[str], env: dict[str, str], tmp: Path) -> float:
    out = tmp / "normal-out"
    run_env = {**env, "FLASHML_OUTPUT_DIR": str(out), "FLASHML_CKPT_DIR": str(tmp / "normal-ckpt")}
    done = subprocess.run(_command(script_args), env=run_env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the normal run exited {done.returncode}: {done.stderr[-2000:]}")
    stamps = [json.loads(line)["ts"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps[SKIPPED_HEAD:]))


def _profiled_step_s(script_args: list[str], env: dict[str, str], tmp: Path) -> float:
    from flashruntime.profiling import LocalProfiler

    workdir = tmp / "profile"
    workdir.mkdir()
    profiler = LocalProfiler(_command(script_args), warmup_steps=WARMUP, measured_steps=MEASURED, workdir=workdir,
                             env=env)
    return float(profiler.profile(None, None, budget_seconds=300).step_time_s)


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    if importlib.util.find_spec("torch") is None or shutil.which("torchrun") is None:
        reason = "torch is not installed (pip install torch==2.13.0)"
        return [skipped_row(NAME, SECTION, "step_time_error", "x", reason, target=PROFILED_STEP_ERROR)]
    pairs = 1 if smoke else max(MIN_PAIRS, repeats)
    script_args = SMOKE_ARGS if smoke else FULL_ARGS
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHML_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    normal_s: list[float] = []
    profiled_s: list[float] = []
    for index in range(pairs):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            order = ("normal", "profile") if index % 2 == 0 else ("profile", "normal")  # ABBA
            for which in order:
                if which == "normal":
                    normal_s.append(_normal_step_s(script_args, env, Path(tmp)))
                else:
                    profiled_s.append(_profiled_step_s(script_args, env, Path(tmp)))
    errors = [abs(p / n - 1.0) for p, n in zip(profiled_s, normal_s)]
    notes = [f"{pairs} pairs ABBA; profiled ÷ normal per pair: "
             + ", ".join(f"{p / n:.3f}" for p, n in zip(profiled_s, normal_s)),
             (f"script args {' '.join(script_args)}; profile: {WARMUP} warm-up + {MEASURED} measured steps; "
              f"normal: median ts gap after the first {SKIPPED_HEAD} steps")]
    return [
        measured_row(NAME, SECTION, "step_time_error", "x", errors, ratio=max(errors), target=PROFILED_STEP_ERROR,
                     notes=[*notes, "ratio = the largest error of the pairs: every pair is held to the target"]),
        measured_row(NAME, SECTION, "profiled_step_s", "s", profiled_s, comparator=("normal run's steady state",
                                                                                   normal_s),
                     notes=["ratio = profiled ÷ normal (medians), informational"]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a profile of a few steps measures the step time a normal run settles at, within 15 %",
    section=SECTION,
    run=run,
)
