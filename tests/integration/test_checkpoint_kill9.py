"""kill -9 integrity: a child process writes checkpoints of a few MB in a
loop and is SIGKILLed at random points inside its write window, over and over.

After every kill ``latest_valid_manifest`` returns the previous valid step or the new
complete one, never a torn checkpoint, and the selected step's bytes are exactly what
the writer meant to write. A part with one flipped byte makes a fresh process fall
back to the step before it. The child resumes after each kill the way a restarted
training job does: from the latest valid step, clearing any torn step directory.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flashruntime.checkpoint import latest_valid_manifest, verify_manifest
from flashruntime.checkpoint.local import clear_verification_cache

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLS = 24
MODEL_BYTES = (2 << 20) + 12345
OPTIMIZER_BYTES = 1 << 20

WRITER = textwrap.dedent(
    """
    import os, pickle, random, shutil, sys
    from flashruntime.checkpoint import open_part, write_manifest, latest_valid_manifest

    root, attempt = sys.argv[1], sys.argv[2]
    model_bytes, optimizer_bytes = int(sys.argv[3]), int(sys.argv[4])
    latest = latest_valid_manifest(root)
    step = latest.step + 1 if latest else 1
    print(f"resume {step}", flush=True)
    buffer = bytearray(256 << 10)  # reused after every write, like a serialiser's buffer
    while True:
        step_dir = os.path.join(root, f"step-{step:06d}")
        if os.path.isdir(step_dir):
            shutil.rmtree(step_dir)  # a torn step from a killed attempt
        print(f"begin {step}", flush=True)
        model = random.Random(f"model-{step}").randbytes(model_bytes)
        with open_part(step_dir, "model.bin") as f:
            for offset in range(0, len(model), len(buffer)):
                piece = model[offset : offset + len(buffer)]
                view = memoryview(buffer)[: len(piece)]
                view[:] = piece
                f.write(view)
        digests = {"model.bin": f.digest}
        state = {"step": step, "moments": random.Random(f"opt-{step}").randbytes(optimizer_bytes)}
        with open_part(step_dir, "optimizer.bin") as g:
            pickle.dump(state, g, protocol=pickle.HIGHEST_PROTOCOL)
        digests["optimizer.bin"] = g.digest
        write_manifest(step_dir, job_id="kill9", attempt_id=attempt, step=step, digests=digests)
        print(f"done {step}", flush=True)
        for old in sorted(os.listdir(root)):  # keep the last three steps
            if old.startswith("step-") and int(old[5:]) <= step - 3:
                shutil.rmtree(os.path.join(root, old), ignore_errors=True)
        step += 1
    """
)

SELECT = (
    "import sys\n"
    "from flashruntime.checkpoint import latest_valid_manifest\n"
    "manifest = latest_valid_manifest(sys.argv[1])\n"
    "print(manifest.step if manifest else 0)\n"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@dataclass
class _Child:
    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.strip()))
                self.cond.notify_all()
        with self.cond:
            self.lines.append((time.monotonic(), "<eof>"))
            self.cond.notify_all()

    def wait_for(self, predicate, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate([text for _, text in self.lines]):
                if self.lines and self.lines[-1][1] == "<eof>":
                    raise AssertionError(
                        f"writer exited early: {self.process.stderr.read() if self.process.stderr else ''}"
                    )
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"writer made no progress: {self.lines[-5:]}"
                self.cond.wait(remaining)


def _numbers(lines: list[str], word: str) -> list[int]:
    return [int(text.split()[1]) for text in lines if text.startswith(word + " ")]


def _expected_model(step: int) -> bytes:
    return random.Random(f"model-{step}").randbytes(MODEL_BYTES)


def _check_content(root: Path, step: int) -> None:
    step_dir = root / f"step-{step:06d}"
    assert (step_dir / "model.bin").read_bytes() == _expected_model(step), f"step {step}: model.bin is torn"
    state = pickle.loads((step_dir / "optimizer.bin").read_bytes())
    assert state == {"step": step, "moments": random.Random(f"opt-{step}").randbytes(OPTIMIZER_BYTES)}


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x40]))


def _select_in_fresh_process(root: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SELECT, str(root)], env=_env(), capture_output=True, text=True, timeout=120, check=True
    )
    return int(out.stdout.strip())


def test_kill9_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(20260301)
    root = tmp_path / "ckpt"
    root.mkdir()
    valid_step = 0  # the latest valid step known after the previous kill
    checkpoint_seconds = 0.05  # refined from the writer's own begin/done timestamps
    in_window = 0
    fallbacks = 0
    flip_due = False

    for kill in range(KILLS):
        process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), f"attempt-{kill}", str(MODEL_BYTES), str(OPTIMIZER_BYTES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        child = _Child(process)
        pump = threading.Thread(target=child.pump, daemon=True)
        pump.start()
        try:
            child.wait_for(lambda lines: any(t.startswith("resume ") for t in lines))
            resume = _numbers([t for _, t in child.lines], "resume")[0]
            assert resume == valid_step + 1
            # let 0-2 checkpoints complete, then kill somewhere inside the next write window
            target = resume + rng.randint(0, 2)
            child.wait_for(lambda lines, target=target: target in _numbers(lines, "begin"))
            time.sleep(rng.uniform(0.0, 1.2 * checkpoint_seconds))
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=60)
        pump.join(timeout=60)
        assert process.returncode == -signal.SIGKILL

        lines = [text for _, text in child.lines]
        done = _numbers(lines, "done")
        begun = _numbers(lines, "begin")
        stamps = {text: at for at, text in child.lines}
        durations = [stamps[f"done {s}"] - stamps[f"begin {s}"] for s in done]
        if durations:
            checkpoint_seconds = sorted(durations)[len(durations) // 2]
        last_done = done[-1] if done else valid_step
        in_progress = begun[-1] if begun and begun[-1] not in done else None
        in_window += in_progress is not None

        clear_verification_cache()  # select as a restarted process would: re-hash everything it picks
        chosen = latest_valid_manifest(root)
        assert chosen is not None or last_done == 0
        chosen_step = chosen.step if chosen else 0
        assert chosen_step in {last_done, in_progress}, (
            f"kill {kill}: selected step {chosen_step}; expected the last complete step {last_done}"
            f" or the step being written ({in_progress})"
        )
        if chosen is not None:
            step_dir = root / f"step-{chosen_step:06d}"
            clear_verification_cache()
            assert verify_manifest(chosen, step_dir)
            _check_content(root, chosen_step)
        valid_step = chosen_step

        flip_due = flip_due or kill % 4 == 3
        if flip_due and chosen_step >= 2:
            flip_due = False
            # one flipped byte in the selected step: a fresh process falls back to the step before it
            part = rng.choice(["model.bin", "optimizer.bin"])
            path = root / f"step-{chosen_step:06d}" / part
            _flip_byte(path, rng.randrange(path.stat().st_size))
            assert _select_in_fresh_process(root) == chosen_step - 1
            clear_verification_cache()
            assert latest_valid_manifest(root).step == chosen_step - 1
            _check_content(root, chosen_step - 1)
            valid_step = chosen_step - 1  # the next attempt rewrites the corrupted step
            fallbacks += 1

    assert in_window >= KILLS // 4, f"only {in_window} of {KILLS} kills landed inside a checkpoint write"
    assert fallbacks >= 4
    leftovers = [p for p in root.rglob(".*.tmp")]
    assert all(p.parent.name.startswith("step-") for p in leftovers)  # torn temp files never count as parts
