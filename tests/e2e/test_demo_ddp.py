"""``flashruntime demo --ddp``: the same crash, decision and resume with torch DDP on
2 CPU ranks (gloo), from the trainer bundled in the package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_demo_ddp_recovers_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "flashruntime.cli", "demo", "--ddp", "--json",
                           "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    messages = {e["type"]: e["message"] for e in report["events"]}
    assert messages["FAILURE_CLASSIFIED"].startswith("task-000: worker_crash")
    assert messages["RESUME_SELECTED"].startswith("task-000-r1 resumes from step 20")
    assert report["trial"]["world_size"] == 2 and report["trial"]["started_from_step"] == 20
