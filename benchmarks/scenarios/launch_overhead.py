"""launch_overhead: ``flashruntime submit`` of a 2-rank torchrun job against the same
bare ``torchrun`` command, whole process each, paired in ABBA order."""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.targets import LAUNCH_OVER_TORCHRUN

NAME, SECTION = "launch_overhead", "performance"
REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "examples" / "ddp_train.py"
MIN_PAIRS = 9
# Sized so that bare torchrun takes 20-30 s on the 2-core reference host.
FULL_ARGS = ["--steps", "200", "--checkpoint-every", "0", "--sleep-per-step", "0.1"]
SMOKE_ARGS = ["--steps", "5", "--checkpoint-every", "0"]


def _torchrun(script_args: list[str]) -> list[str]:
    return ["torchrun", "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
            str(SCRIPT), *script_args]


def _time(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def run(repeats: int, smoke: bool) -> list[dict]:
    if importlib.util.find_spec("torch") is None or shutil.which("torchrun") is None:
        reason = "torch is not installed (pip install torch==2.13.0)"
        return [skipped_row(NAME, SECTION, "submit_vs_torchrun", "s", reason, target=LAUNCH_OVER_TORCHRUN)]
    pairs = 1 if smoke else max(MIN_PAIRS, repeats)
    script_args = SMOKE_ARGS if smoke else FULL_ARGS
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    ours_s, bare_s = [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHML_")}
    env["CI"] = env.get("CI", "1")  # no viewer, no browser
    for index in range(pairs):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            bare_env = {**env, "FLASHML_OUTPUT_DIR": str(Path(tmp) / "bare"), "FLASHML_CKPT_DIR": str(Path(tmp) / "ck")}
            ours_argv = [sys.executable, "-m", "flashruntime.cli", "submit", "--no-watch",
                         "--output-dir", str(Path(tmp) / "ours"), " ".join(_torchrun(script_args))]
            order = ("bare", "ours") if index % 2 == 0 else ("ours", "bare")  # ABBA
            for which in order:
                if which == "bare":
                    bare_s.append(_time(_torchrun(script_args), bare_env))
                else:
                    ours_s.append(_time(ours_argv, env))
    ratios = [o / b for o, b in zip(ours_s, bare_s)]
    notes = [f"{pairs} pairs ABBA; per-pair ratio min {min(ratios):.3f}, max {max(ratios):.3f}",
             f"script args {' '.join(script_args)}; sampler at its default period, viewer off"]
    return [
        measured_row(NAME, SECTION, "submit_vs_torchrun", "s", ours_s, comparator=("bare torchrun", bare_s),
                     ratio=statistics.median(ratios), target=LAUNCH_OVER_TORCHRUN, notes=notes),
        measured_row(NAME, SECTION, "overhead_s", "s", [o - b for o, b in zip(ours_s, bare_s)],
                     notes=["median per-pair difference, informational"]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="flash.submit adds at most 2 % to the wall time of a 2-rank torchrun job",
    section=SECTION,
    run=run,
)
