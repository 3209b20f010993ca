"""``checkpoint_commit``: what a verified checkpoint costs over a bare save.

Ours: the state is written into a part through ``open_part`` (hashed on a helper thread
while it is written), then ``write_manifest`` (manifest last: temp, fsync, rename,
directory fsync), ``verify_manifest`` of the new step and ``latest_valid_manifest`` of
the root, which retains the last three steps (``open_part`` starts writeback as it
goes, so its final fsync has little left to push). Comparator: ``torch.save`` of the same
state into one file, flush, fsync (``pickle.dump`` when torch is absent). Samples
alternate ABBA after one discarded warm-up each; files live on the repository's
filesystem under ``benchmarks/.work``, never tmpfs, and are removed afterwards.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import CHECKPOINT_COMMIT_OVER_BARE_SAVE

NAME = "checkpoint_commit"
SECTION = "performance"
MIN_SAMPLES = 5
RETAINED = 3
TARGET = CHECKPOINT_COMMIT_OVER_BARE_SAVE
WORK_DIR = Path(__file__).resolve().parents[1] / ".work"

# (label, total bytes, tensors): the state is split like a model's parameters.
SIZES = (("1mb", 1 << 20, 4), ("100mb", 100 << 20, 25))


def _state(total: int, count: int, use_torch: bool) -> dict[str, Any]:
    per = total // count
    if use_torch:
        import torch

        generator = torch.Generator().manual_seed(total)
        return {f"layer{i}.weight": torch.randn(per // 4, generator=generator) for i in range(count)}
    return {f"layer{i}.weight": os.urandom(per) for i in range(count)}


def _saver(use_torch: bool) -> Callable[[Any, Any], None]:
    if use_torch:
        import torch

        return torch.save
    return lambda state, handle: pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)


class _Ours:
    """One verified commit per call into a root that retains the last few steps."""

    def __init__(self, root: Path, state: dict[str, Any], save: Callable[[Any, Any], None]) -> None:
        self.root = root
        self.state = state
        self.save = save
        self.step = 0
        self.phases: dict[str, list[float]] = {"write": [], "manifest": [], "verify": [], "select": []}

    def __call__(self) -> float:
        from flashruntime.checkpoint import latest_valid_manifest, open_part, verify_manifest, write_manifest

        self.step += 1
        step_dir = self.root / f"step-{self.step:06d}"
        t0 = time.perf_counter()
        with open_part(step_dir, "model.pt") as part:
            self.save(self.state, part)
        t1 = time.perf_counter()
        manifest = write_manifest(
            step_dir, job_id="bench", attempt_id="bench", step=self.step, digests={"model.pt": part.digest}
        )
        t2 = time.perf_counter()
        verified = verify_manifest(manifest, step_dir)
        t3 = time.perf_counter()
        selected = latest_valid_manifest(self.root)
        t4 = time.perf_counter()
        if not verified or selected is None or selected.manifest_id != manifest.manifest_id:
            raise RuntimeError(f"checkpoint_commit: step {self.step} did not verify or was not selected")
        for name, start, end in (("write", t0, t1), ("manifest", t1, t2), ("verify", t2, t3), ("select", t3, t4)):
            self.phases[name].append((end - start) * 1e3)
        old = self.root / f"step-{self.step - RETAINED:06d}"
        if old.exists():
            shutil.rmtree(old)
        return (t4 - t0) * 1e3


class _Bare:
    """The comparator: one file, save + flush + fsync."""

    def __init__(self, path: Path, state: dict[str, Any], save: Callable[[Any, Any], None]) -> None:
        self.path = path
        self.state = state
        self.save = save

    def __call__(self) -> float:
        t0 = time.perf_counter()
        with open(self.path, "wb") as handle:
            self.save(self.state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        elapsed = (time.perf_counter() - t0) * 1e3
        os.unlink(self.path)
        return elapsed


def _measure(label: str, total: int, count: int, samples: int, warmup: bool, use_torch: bool, base: Path):
    state = _state(total, count, use_torch)
    save = _saver(use_torch)
    ours_fn = _Ours(base / f"ckpt-{label}", state, save)
    bare_fn = _Bare(base / f"bare-{label}.pt", state, save)
    (base / f"ckpt-{label}").mkdir()
    if warmup:
        bare_fn()
        ours_fn()
        for phase in ours_fn.phases.values():
            phase.clear()
    ours: list[float] = []
    bare: list[float] = []
    for index in range(samples):
        order = (bare_fn, ours_fn) if index % 4 in (0, 3) else (ours_fn, bare_fn)  # ABBA
        for fn in order:
            gc.collect()
            (ours if fn is ours_fn else bare).append(fn())
    phases = {name: statistics.median(values) for name, values in ours_fn.phases.items()}
    return ours, bare, phases


def _load_average() -> str:
    try:
        return "/".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    from benchmarks.host import filesystem_type

    try:
        import torch  # noqa: F401

        use_torch = True
    except ImportError:
        use_torch = False
    comparator_name = "torch.save+fsync" if use_torch else "pickle+fsync"
    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    sizes = SIZES[:1] if smoke else SIZES
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="checkpoint_commit-", dir=WORK_DIR))
    rows = []
    try:
        fs = filesystem_type(base)
        for label, total, count in sizes:
            load_before = _load_average()
            ours, bare, phases = _measure(label, total, count, samples, not smoke, use_torch, base)
            load_after = _load_average()
            notes = [
                "ours = open_part (hashed on a helper thread while written, one pass) + write_manifest"
                f" + verify_manifest of the new step + latest_valid_manifest over {RETAINED} retained steps",
                "open_part starts kernel writeback every 8 MiB (posix_fadvise DONTNEED) and fsyncs at the end;"
                " the comparator is the bare save + flush + fsync",
                f"state: {count} {'float32 tensors' if use_torch else 'bytes objects'} totalling {total >> 20} MiB;"
                f" files on {fs} under benchmarks/.work",
                "phase medians (ms): " + ", ".join(f"{name} {value:.2f}" for name, value in phases.items()),
                f"load average (1/5/15 min) before {load_before}, after {load_after}:"
                " hashing needs the second core, so a busy host inflates the ratio",
            ]
            if not use_torch:
                notes.append("torch is not importable here: both sides write the state with pickle.dump instead")
            if fs == "tmpfs":
                notes.append("warning: the work directory is on tmpfs, so fsync costs nothing here")
            rows.append(
                measured_row(
                    NAME,
                    SECTION,
                    f"ms_per_commit_{label}",
                    "ms",
                    ours,
                    comparator=(comparator_name, bare),
                    target=TARGET if label == "100mb" else None,
                    notes=notes,
                )
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "Hashing a checkpoint while it is written (one pass) and committing its manifest last keeps"
        " write + validate + select within 1.15x of a bare torch.save + fsync at 100 MB."
    ),
    section=SECTION,
    run=run,
)
