"""``checkpoint_integrity``: ``kill -9`` inside the checkpoint write window.

A child process writes checkpoints in a loop and reports each write window on stdout
("open <step>" right before the write starts, "done <step> <seconds>" once it is
committed). The parent waits for a window to open, sleeps a delay drawn uniformly in
[0, typical window length] (the median of a few unkilled writes measured first), then
SIGKILLs the child. A kill counts as in-window only when the child's last report before
it was "open" (the window it opened had not been reported closed). After every kill the
checkpoint root is inspected and the child is restarted; it continues with new steps.

Ours: two parts of raw bytes through ``open_part`` + ``write_manifest`` (the
path ``ft.checkpoint`` uses). After a kill every ``step-*`` directory must verify
(``verify_manifest``) or have no ``manifest.json`` (recovery ignores it), and
``latest_valid_manifest`` must not raise and must return the newest verifying step (or
None). integrity = kills after which that holds / in-window kills.

Comparator: the same loop with a naive ``torch.save(state, final_path)`` straight to the
final name (no temporary file, no manifest, no fsync); a kill corrupts when the final file
exists but does not load back whole. Without torch the naive write is ``pickle.dump`` of
the same bytes into the final file, checked with ``pickle.load``.
"""

from __future__ import annotations

import math
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.host import torch_importable
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row

NAME = "checkpoint_integrity"
SECTION = "resilience"
WORK_DIR = Path(__file__).resolve().parents[1] / ".work"
PART_BYTES = 4 << 20  # two parts of this many random bytes per checkpoint
MIN_KILLS = 30  # in-window kills per side in a full run (spread over BATCHES samples)
BATCHES = 3
SMOKE_KILLS = 3
CALIBRATION_WRITES = 5
SMOKE_CALIBRATION_WRITES = 3
RETAINED = 3  # the parent keeps the newest few step entries between kills (pruned only while no child runs)
LINE_TIMEOUT_S = 60.0  # no report from the child for this long: it is stuck

UNIT = "fraction of in-window kills"

CHILD = r"""
import os, sys, time
mode, root, start, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model, optimizer = os.urandom(size), os.urandom(size)
if mode == "ours":
    from flashruntime.checkpoint.local import open_part, write_manifest

    def save(step):
        step_dir = os.path.join(root, f"step-{step:06d}")
        digests = {}
        with open_part(step_dir, "model.bin") as part:
            part.write(model)
        digests["model.bin"] = part.digest
        with open_part(step_dir, "optimizer.bin") as part:
            part.write(optimizer)
        digests["optimizer.bin"] = part.digest
        write_manifest(step_dir, job_id="bench", attempt_id=f"pid-{os.getpid()}", step=step, digests=digests)
elif mode == "torch":
    import torch

    state = {"model": {"weight": torch.frombuffer(bytearray(model), dtype=torch.float32)},
             "optimizer": {"momentum": torch.frombuffer(bytearray(optimizer), dtype=torch.float32)}}

    def save(step):
        torch.save(state, os.path.join(root, f"step-{step:06d}.pt"))
elif mode == "pickle":
    import pickle

    state = {"model": model, "optimizer": optimizer}

    def save(step):
        with open(os.path.join(root, f"step-{step:06d}.pkl"), "wb") as handle:
            pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
else:
    raise SystemExit(f"unknown mode {mode!r}")
for step in range(start, start + count):
    print(f"open {step}", flush=True)
    t0 = time.perf_counter()
    save(step)
    elapsed = time.perf_counter() - t0
    print(f"done {step} {elapsed:.6f}", flush=True)
"""

_STEP = re.compile(r"step-(\d+)")


class _Child:
    """One writer process; its stdout lines arrive on a queue through a reader thread."""

    def __init__(self, mode: str, root: Path, start: int, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, str(root), str(start), str(count), str(PART_BYTES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self) -> str | None:
        """The next report, or None when the child has exited."""
        try:
            return self.lines.get(timeout=LINE_TIMEOUT_S)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"checkpoint_integrity: no report from the writer for {LINE_TIMEOUT_S:.0f} s") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def remaining(self) -> list[str]:
        """Every report left after the child ended (its stdout is then closed)."""
        self.reader.join(timeout=LINE_TIMEOUT_S)
        rest: list[str] = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                rest.append(line)
        if self.proc.stdout is not None and not self.reader.is_alive():
            self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return rest

    def stderr_tail(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-2000:]


def _steps(root: Path) -> list[tuple[int, Path]]:
    found = []
    for path in root.iterdir():
        match = _STEP.fullmatch(path.name.split(".")[0])
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _prune(root: Path) -> None:
    """Keep the newest RETAINED step entries; called only while no writer runs."""
    for _, path in _steps(root)[:-RETAINED]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _calibrate(mode: str, root: Path, writes: int) -> list[float]:
    """Window lengths (s) of ``writes`` unkilled writes, as the child timed them."""
    child = _Child(mode, root, 1, writes)
    try:
        child.proc.wait(timeout=LINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
    if child.proc.returncode != 0:
        raise RuntimeError(f"checkpoint_integrity: calibration writer ({mode}) failed: {child.stderr_tail()}")
    lines = child.remaining()
    return [float(line.split()[2]) for line in lines if line.startswith("done ")]


def _inspect_ours(root: Path, killed: int) -> tuple[bool, str]:
    """(every step valid-or-absent and the selection right, what the killed step left)."""
    from flashruntime.checkpoint.local import clear_verification_cache, latest_valid_manifest, verify_manifest
    from flashruntime.protocol.v1alpha1 import CheckpointManifest

    clear_verification_cache()  # inspect as a freshly restarted job would: re-hash everything
    ok = True
    newest_valid: int | None = None
    steps = _steps(root)
    for step, step_dir in steps:
        manifest_path = step_dir / "manifest.json"
        if not manifest_path.exists():
            continue  # absent: recovery ignores this step
        try:
            manifest = CheckpointManifest.model_validate_json(manifest_path.read_bytes())
        except (OSError, ValueError):
            ok = False
            continue
        if verify_manifest(manifest, step_dir) and manifest.step == step:
            newest_valid = step
        else:
            ok = False
    try:
        selected = latest_valid_manifest(root)
    except Exception:  # noqa: BLE001 - any exception here is the failure being counted
        return False, "latest_valid_manifest raised"
    if selected is None:
        ok = ok and newest_valid is None
    else:
        ok = ok and selected.step == newest_valid and verify_manifest(selected, selected.storage_prefix)
    killed_dir = root / f"step-{killed:06d}"
    if not killed_dir.exists():
        left = "no directory yet"
    elif (killed_dir / "manifest.json").exists():
        left = "committed"
    else:
        left = "parts without manifest" if any(killed_dir.iterdir()) else "empty directory"
    return ok, left


def _loads_whole(path: Path, mode: str) -> bool:
    """The naive file loads back with both parts at full size."""
    try:
        if mode == "torch":
            import torch

            state = torch.load(path, weights_only=True)
            sizes = [state["model"]["weight"].numel() * 4, state["optimizer"]["momentum"].numel() * 4]
        else:
            import pickle

            with open(path, "rb") as handle:
                state = pickle.load(handle)
            sizes = [len(state["model"]), len(state["optimizer"])]
    except Exception:  # noqa: BLE001 - a torn file fails in many ways (EOFError, RuntimeError, UnpicklingError, ...)
        return False
    return sizes == [PART_BYTES, PART_BYTES]


def _inspect_naive(root: Path, mode: str, killed: int) -> tuple[bool, str]:
    """(no corrupt file, what the killed step left); corrupt files are removed once counted."""
    corrupt = [path for _, path in _steps(root) if not _loads_whole(path, mode)]
    killed_path = root / f"step-{killed:06d}.{'pt' if mode == 'torch' else 'pkl'}"
    if not killed_path.exists():
        left = "no file yet"
    else:
        left = "corrupt file" if killed_path in corrupt else "loads whole"
    for path in corrupt:
        path.unlink()
    return not corrupt, left


def _kill_batch(mode: str, root: Path, kills: int, window_s: float, start: int, rng: random.Random) -> dict[str, Any]:
    """Kill writers until ``kills`` kills landed inside a write window; inspect after each."""
    in_window = intact = attempts = 0
    outcomes: dict[str, int] = {}
    max_attempts = 4 * kills + 10
    step = start
    while in_window < kills and attempts < max_attempts:
        attempts += 1
        skip = rng.randint(0, 2)  # let a few windows pass first, so kills also land behind earlier writes
        child = _Child(mode, root, step, skip + 5)
        seen = 0
        while True:
            line = child.next_line()
            if line is None:
                child.proc.wait()
                raise RuntimeError(f"checkpoint_integrity: writer ({mode}) exited early: {child.stderr_tail()}")
            if line.startswith("done "):
                seen += 1
            elif line.startswith("open ") and seen == skip:
                break
        time.sleep(rng.uniform(0.0, window_s))
        child.kill()
        reports = [line] + child.remaining()
        last = reports[-1]
        killed = int(last.split()[1])
        step = killed + 1  # the restarted writer continues with new steps
        if not last.startswith("open "):
            continue  # the window closed before the kill landed: not counted
        in_window += 1
        ok, left = _inspect_ours(root, killed) if mode == "ours" else _inspect_naive(root, mode, killed)
        intact += ok
        outcomes[left] = outcomes.get(left, 0) + 1
        _prune(root)
    return {"in_window": in_window, "intact": intact, "attempts": attempts, "outcomes": outcomes, "next": step}


def _side(mode: str, base: Path, batches: int, per_batch: int, calibration_writes: int, rng: random.Random):
    root = base / mode
    root.mkdir()
    windows = _calibrate(mode, root, calibration_writes)
    window_s = statistics.median(windows)
    step = calibration_writes + 1
    results = []
    for _ in range(batches):
        result = _kill_batch(mode, root, per_batch, window_s, step, rng)
        step = result["next"]
        results.append(result)
    return windows, results


def _describe(results: list[dict[str, Any]], good: Callable[[dict[str, Any]], int]) -> str:
    parts = []
    for index, result in enumerate(results):
        outcomes = ", ".join(f"{name} {count}" for name, count in sorted(result["outcomes"].items()))
        parts.append(
            f"batch {index + 1}: {good(result)}/{result['in_window']} in-window kills"
            f" ({result['attempts'] - result['in_window']} kill(s) landed after the window closed, not counted;"
            f" killed step left: {outcomes})"
        )
    return "; ".join(parts)


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    if smoke:
        batches, per_batch, calibration = 1, SMOKE_KILLS, SMOKE_CALIBRATION_WRITES
    else:
        batches, calibration = BATCHES, CALIBRATION_WRITES
        per_batch = math.ceil(max(repeats, MIN_KILLS) / BATCHES)
    naive_mode = "torch" if torch_importable() else "pickle"
    comparator = "naive torch.save" if naive_mode == "torch" else "naive pickle write"
    rng = random.Random()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="checkpoint_integrity-", dir=WORK_DIR))
    try:
        from benchmarks.host import filesystem_type

        fs = filesystem_type(base)
        ours_windows, ours = _side("ours", base, batches, per_batch, calibration, rng)
        naive_windows, naive = _side(naive_mode, base, batches, per_batch, calibration, rng)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    if any(r["in_window"] == 0 for r in ours + naive):
        reason = "a batch had no kill inside a write window (windows too short to hit on this host)"
        return [skipped_row(NAME, SECTION, metric, UNIT, reason) for metric in ("integrity", "corruption_rate")]

    ours_total = sum(r["in_window"] for r in ours)
    ours_intact = sum(r["intact"] for r in ours)
    naive_total = sum(r["in_window"] for r in naive)
    naive_corrupt = sum(r["in_window"] - r["intact"] for r in naive)
    setup = (
        f"each checkpoint = 2 parts of {PART_BYTES >> 20} MiB random bytes; files on {fs} under benchmarks/.work;"
        " kill = SIGKILL of the writer process after a delay drawn uniformly in [0, median window length]"
        " from its 'open' report; in-window = the writer had not reported the window closed; restarted after"
        " each kill, continuing with new steps"
    )
    windows = (
        f"window length (median of {len(ours_windows)} unkilled writes): ours {statistics.median(ours_windows) * 1e3:.1f}"
        f" ms, {comparator} {statistics.median(naive_windows) * 1e3:.1f} ms"
    )
    ours_notes = [
        f"ours: {ours_intact}/{ours_total} in-window kills left every step valid-or-absent: "
        + _describe(ours, lambda r: r["intact"]),
        (
            "ours = open_part x2 (raw bytes, hashed while written, fsync, rename) + write_manifest (manifest last);"
            " after each kill every step-* directory verifies (verify_manifest, verification cache cleared) or has"
            " no manifest.json, and latest_valid_manifest returns the newest verifying step (or None) without raising"
        ),
        setup,
        windows,
    ]
    naive_notes = [
        (
            f"ours: {ours_total - ours_intact}/{ours_total} in-window kills left a step with a manifest that does"
            " not verify, or a wrong latest_valid_manifest selection"
        ),
        f"{comparator}: {naive_corrupt}/{naive_total} in-window kills left a corrupt file: "
        + _describe(naive, lambda r: r["in_window"] - r["intact"]),
        (
            f"{comparator} = {'torch.save' if naive_mode == 'torch' else 'pickle.dump'} of the same bytes straight"
            " to the final file name (no temporary file, no manifest, no fsync); corrupt = the final file exists"
            f" but {'torch.load' if naive_mode == 'torch' else 'pickle.load'} fails or returns short parts"
        ),
        setup,
        windows,
    ]
    if naive_mode == "pickle":
        naive_notes.append("torch is not importable here: the comparator writes with pickle.dump instead of torch.save")
    return [
        measured_row(NAME, SECTION, "integrity", UNIT, [r["intact"] / r["in_window"] for r in ours], notes=ours_notes),
        measured_row(
            NAME,
            SECTION,
            "corruption_rate",
            UNIT,
            [(r["in_window"] - r["intact"]) / r["in_window"] for r in ours],
            comparator=(comparator, [(r["in_window"] - r["intact"]) / r["in_window"] for r in naive]),
            notes=naive_notes,
        ),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "A kill -9 anywhere in the checkpoint write window never leaves a checkpoint that recovery would"
        " select but cannot load: every step is valid or has no manifest, while a naive torch.save to the"
        " final name leaves corrupt files."
    ),
    section=SECTION,
    run=run,
)
