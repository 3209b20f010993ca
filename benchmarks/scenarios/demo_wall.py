"""demo_wall: one whole ``flashruntime demo`` process with default arguments
(injected crash, recovery, resume), spawn to exit."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import DEMO_WALL_S

NAME, SECTION = "demo_wall", "performance"


def run(repeats: int, smoke: bool) -> list[dict]:
    samples = 1 if smoke else max(3, repeats)
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    walls, codes = [], []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "flashruntime.cli", "demo", "--output-dir", tmp],
                                  capture_output=True, text=True, timeout=300, check=False)
            walls.append(time.perf_counter() - started)
            codes.append(done.returncode)
    return [measured_row(NAME, SECTION, "demo_wall_s", "s", walls, target=DEMO_WALL_S,
                         notes=[f"exit codes {codes}"])]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="flashruntime demo shows a crash, the recovery decision and the resume in under 30 s",
    section=SECTION,
    run=run,
)
