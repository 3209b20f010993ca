"""``checkpoint_cost``: what one ``ft.checkpoint`` call costs in a training script.

Ours: ``flashruntime.torch.checkpoint(model, optimizer, step=s)`` in this process (world
size 1, ``FLASHML_CKPT_DIR`` and ``FLASHML_OUTPUT_DIR`` pointed under the work directory):
heartbeat, ``model.pt`` and ``optimizer.pt`` through ``open_part`` (hashed while written,
fsynced, renamed), then ``write_manifest`` (manifest last, directory fsync). Comparator:
the bare ``torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
path)`` of the same state to one file on the same filesystem, without fsync. Samples
alternate ABBA after one discarded warm-up each; every sample writes a fresh
step (the step directory and the comparator file are removed after each). Without torch
the rows are skipped, never estimated.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.host import torch_importable
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row

NAME = "checkpoint_cost"
SECTION = "performance"
MIN_SAMPLES = 5
WORK_DIR = Path(__file__).resolve().parents[1] / ".work"
COMPARATOR = "bare torch.save"

# (label, layers, width): a stack of ``layers`` nn.Linear(width, width), float32.
# 1 x 512 x 512 (+bias) ~ 1 MiB of parameters; 4 x 2560 x 2560 (+bias) ~ 100 MiB.
SIZES = (("1mb", 1, 512), ("100mb", 4, 2560))

_ENV_KEYS = ("FLASHML_CKPT_DIR", "FLASHML_OUTPUT_DIR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables; restore them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _model_and_optimizer(layers: int, width: int) -> tuple[Any, Any, int]:
    """A Linear stack and an SGD-with-momentum optimizer that has state after one step."""
    import torch

    torch.manual_seed(layers * 100003 + width)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model(torch.randn(4, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    return model, optimizer, params


def _ours(model: Any, optimizer: Any, ckpt_root: Path) -> Callable[[], float]:
    import flashruntime.torch as ft

    step = 0

    def sample() -> float:
        nonlocal step
        step += 1
        step_dir = ckpt_root / f"step-{step:06d}"
        t0 = time.perf_counter()
        ft.checkpoint(model, optimizer, step=step)
        elapsed = (time.perf_counter() - t0) * 1e3
        if not (step_dir / "manifest.json").is_file():
            raise RuntimeError(f"checkpoint_cost: ft.checkpoint wrote no manifest into {step_dir}")
        shutil.rmtree(step_dir)
        return elapsed

    return sample


def _bare(model: Any, optimizer: Any, path: Path) -> Callable[[], float]:
    import torch

    def sample() -> float:
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        elapsed = (time.perf_counter() - t0) * 1e3
        path.unlink()
        return elapsed

    return sample


def _measure(label: str, layers: int, width: int, samples: int, base: Path):
    model, optimizer, params = _model_and_optimizer(layers, width)
    ckpt_root = base / f"ckpt-{label}"
    out_dir = base / f"out-{label}"
    ckpt_root.mkdir()
    out_dir.mkdir()
    env = {key: None for key in _ENV_KEYS}
    env.update(FLASHML_CKPT_DIR=str(ckpt_root), FLASHML_OUTPUT_DIR=str(out_dir))
    with _environment(env):
        ours_fn = _ours(model, optimizer, ckpt_root)
        bare_fn = _bare(model, optimizer, base / f"bare-{label}.pt")
        # One discarded warm-up each (smoke too): the first call pays one-off imports
        # (flashruntime.torch, the manifest schema) that are no per-checkpoint cost.
        bare_fn()
        ours_fn()
        ours: list[float] = []
        bare: list[float] = []
        for index in range(samples):
            order = (bare_fn, ours_fn) if index % 4 in (0, 3) else (ours_fn, bare_fn)  # ABBA
            for fn in order:
                gc.collect()
                (ours if fn is ours_fn else bare).append(fn())
    return ours, bare, params


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    sizes = SIZES[:1] if smoke else SIZES
    if not torch_importable():
        reason = "torch is not importable here: ft.checkpoint and torch.save need it (skipped, never estimated)"
        return [skipped_row(NAME, SECTION, f"ms_per_checkpoint_{label}", "ms", reason) for label, _, _ in sizes]

    from benchmarks.host import filesystem_type

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="checkpoint_cost-", dir=WORK_DIR))
    rows = []
    try:
        fs = filesystem_type(base)
        for label, layers, width in sizes:
            ours, bare, params = _measure(label, layers, width, samples, base)
            mib = params * 4 / (1 << 20)
            notes = [
                (
                    "ours = flashruntime.torch.checkpoint(model, optimizer, step=s) in one process (world size 1):"
                    " forced heartbeat, model.pt and optimizer.pt through open_part (hashed while written, fsync,"
                    " rename), write_manifest (manifest last, directory fsync)"
                ),
                (
                    f"comparator = {COMPARATOR}({{'model': model.state_dict(), 'optimizer': optimizer.state_dict()}},"
                    " path) to one file, no fsync: the ratio includes the durability (fsync) and hashing ours adds"
                ),
                (
                    f"state: {layers} x nn.Linear({width}, {width}) = {params:,} float32 parameters ({mib:.1f} MiB)"
                    f" + SGD momentum buffers of the same size after one step; files on {fs} under benchmarks/.work"
                ),
                (
                    f"{len(ours)} sample(s) per side, ABBA order, after one discarded warm-up each (first-call"
                    " imports); each sample writes a fresh step (removed afterwards)"
                ),
            ]
            if fs == "tmpfs":
                notes.append("warning: the work directory is on tmpfs, so fsync costs nothing here")
            rows.append(
                measured_row(
                    NAME,
                    SECTION,
                    f"ms_per_checkpoint_{label}",
                    "ms",
                    ours,
                    comparator=(COMPARATOR, bare),
                    notes=notes,
                )
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "A verified ft.checkpoint (two parts hashed while written and fsynced, manifest committed last) adds"
        " a bounded per-checkpoint cost over a bare torch.save of the same model and optimizer state."
    ),
    section=SECTION,
    run=run,
)
