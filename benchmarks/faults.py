"""Fault injection for benchmarks and tests, read as scenarios:
a trainer armed to crash a given way, a killer that acts on the newest running
attempt of a ``Run``, and a byte flip in the newest checkpoint part.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

CRASHES = (None, "import_error", "systemexit_mid", "hang_after_step")

_TRAINER = '''\
"""Crashy trainer written by benchmarks.faults: pure Python, checkpointed through
verified manifests; crashes {crash!r} on its first attempt only."""
import json, os, sys, time
from pathlib import Path
{import_error}
from flashruntime.checkpoint.local import latest_valid_manifest, open_part, write_manifest

STEPS, EVERY, CRASH = {steps}, {every}, {crash!r}
STEP_SECONDS = float(os.environ.get("CRASHY_STEP_SECONDS", "0.01"))
WRITE_WINDOW_SECONDS = float(os.environ.get("CRASHY_WRITE_WINDOW_SECONDS", "0"))
FIRST_ATTEMPT = "-r" not in os.environ.get("FLASHML_ATTEMPT_ID", "")
out = Path(os.environ.get("FLASHML_OUTPUT_DIR", "."))
ckpt = Path(os.environ.get("FLASHML_CKPT_DIR", str(out / ".." / "ckpt")))
out.mkdir(parents=True, exist_ok=True)
manifest = latest_valid_manifest(ckpt)
start = manifest.step if manifest else 0
value = json.loads((Path(manifest.storage_prefix) / "state.json").read_text())["value"] if manifest else 0.0
with open(out / "metrics.jsonl", "a") as stream:
    for step in range(start, STEPS):
        if FIRST_ATTEMPT and step == STEPS // 2:
            if CRASH == "systemexit_mid":
                raise SystemExit(1)
            if CRASH == "hang_after_step":
                time.sleep(3600)
        value = value * 0.9 + step  # deterministic "training"
        stream.write(json.dumps({{"step": step + 1, "loss": 1.0 / (1.0 + value)}}) + "\\n")
        stream.flush()
        time.sleep(STEP_SECONDS)
        if EVERY and (step + 1) % EVERY == 0 and step + 1 < STEPS:
            step_dir = ckpt / f"step-{{step + 1:06d}}"
            step_dir.mkdir(parents=True, exist_ok=True)
            with open_part(step_dir, "state.json") as part:
                part.write(json.dumps({{"value": value, "pad": "x" * 4096}}).encode())
            (out / "in_write_window").write_text(str(step + 1))
            time.sleep(WRITE_WINDOW_SECONDS)  # parts on disk, manifest not yet: the torn window
            write_manifest(step_dir, job_id="bench", attempt_id=os.environ.get("FLASHML_ATTEMPT_ID", "a"),
                           step=step + 1, digests={{"state.json": part.digest}})
            (out / "in_write_window").unlink()
json.dump({{"final_value": value, "started_from_step": start, "steps": STEPS}}, open(out / "metrics.json", "w"))
'''


def write_crashy_trainer(dir: str | Path, steps: int, checkpoint_every: int, crash: str | None = None) -> Path:
    """Write ``crashy_trainer.py`` into ``dir`` and return its path."""
    if crash not in CRASHES:
        raise ValueError(f"crash must be one of {CRASHES}, got {crash!r}")
    if steps < 2 or checkpoint_every < 0:
        raise ValueError(f"need steps >= 2 and checkpoint_every >= 0, got steps={steps}, every={checkpoint_every}")
    directory = Path(dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "crashy_trainer.py"
    import_error = "import flashruntime_bench_missing_module  # injected ImportError" if crash == "import_error" else ""
    path.write_text(_TRAINER.format(steps=steps, every=checkpoint_every, crash=crash, import_error=import_error))
    return path


def _running_attempt(run: Any) -> dict[str, Any] | None:
    rows = [a for a in run.attempts if a["state"] == "RUNNING"]
    return rows[-1] if rows else None


def _rank_pids(attempt_dir: str) -> list[int]:
    """Worker processes of an attempt, found as the launcher finds them."""
    from flashruntime.launchers._sweep import attempt_processes

    marker = f"FLASHML_OUTPUT_DIR={attempt_dir}".encode()
    return sorted(attempt_processes(marker, []))


def kill_child(run: Any, when: Any, timeout_s: float, *, target: str = "leader") -> bool:
    """SIGKILL the newest RUNNING attempt once ``when(attempt_row)`` is true.

    ``target="leader"`` kills the leader's process group (the launcher's sweep then
    removes the ranks); ``target="rank"`` kills one worker process found through the
    attempt's environment marker. Returns False if nothing was killed in time.
    """
    if target not in ("leader", "rank"):
        raise ValueError(f"target must be 'leader' or 'rank', got {target!r}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = _running_attempt(run)
        if row is not None and row.get("pid") and when(row):
            leader = int(row["pid"])
            try:
                if target == "leader":
                    os.killpg(leader, signal.SIGKILL)
                    return True
                ranks = [p for p in _rank_pids(row["output_dir"]) if p != leader]
                if ranks:
                    os.kill(ranks[-1], signal.SIGKILL)
                    return True
            except ProcessLookupError:
                pass
        if run.state.terminal:
            return False
        time.sleep(0.01)
    return False


def corrupt_newest_part(ckpt_root: str | Path) -> Path | None:
    """Flip one byte in a part of the newest step that has a manifest; returns the part."""
    steps = sorted(p for p in Path(ckpt_root).glob("step-*") if (p / "manifest.json").is_file())
    if not steps:
        return None
    parts = sorted(p for p in steps[-1].iterdir() if p.is_file() and p.name != "manifest.json"
                   and not p.name.startswith("."))
    if not parts:
        return None
    part = parts[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stat = part.stat()
    part.write_bytes(bytes(data))
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: only the hash can tell
    return part
