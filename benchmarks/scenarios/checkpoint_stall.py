"""``checkpoint_stall``: how long ``ft.checkpoint`` holds the training thread, asynchronous
against synchronous.

Ours: ``flashruntime.torch.checkpoint(model, optimizer, step=s, async_save=True)`` in this
process (world size 1): the time until the call returns (the state copied to host memory,
the background write started). Comparator: the same call with ``async_save=False``, which
returns once the step is written, fsynced, hashed and committed. Both save the same state
as ``checkpoint_cost`` (a Linear stack and its SGD momentum). After each timed call the
sample waits (untimed) for the background write and checks the committed manifest, so
every sample starts with no save in flight. Samples alternate ABBA after one discarded
warm-up each (the warm-up of the asynchronous side allocates the host copy that later
saves reuse). A third row times a forward and backward step of the same model while a
background write runs, against the same step with nothing in flight: what the writing thread
takes from training. Without torch the rows are skipped, never estimated.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.host import torch_importable
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.scenarios.checkpoint_cost import _ENV_KEYS, SIZES, _environment, _model_and_optimizer
from benchmarks.targets import CHECKPOINT_STALL_ASYNC_OVER_SYNC

NAME = "checkpoint_stall"
SECTION = "performance"
MIN_SAMPLES = 5
WORK_DIR = Path(__file__).resolve().parents[1] / ".work"
COMPARATOR = "ft.checkpoint(async_save=False)"

Sample = tuple[float, float]  # (ms the call held the thread, ms until the step was committed)


def _saver(model: Any, optimizer: Any, ckpt_root: Path, counter: list[int], async_save: bool) -> Callable[[], Sample]:
    import flashruntime.torch as ft

    def sample() -> Sample:
        counter[0] += 1
        step = counter[0]
        t0 = time.perf_counter()
        ft.checkpoint(model, optimizer, step=step, async_save=async_save)
        blocked = time.perf_counter() - t0
        ft.wait_for_checkpoint()
        committed = time.perf_counter() - t0
        step_dir = ckpt_root / f"step-{step:06d}"
        if not (step_dir / "manifest.json").is_file():
            raise RuntimeError(f"checkpoint_stall: ft.checkpoint committed no manifest into {step_dir}")
        shutil.rmtree(step_dir)
        return blocked * 1e3, committed * 1e3

    return sample


def _steps_beside_writes(model: Any, optimizer: Any, ckpt_root: Path, counter: list[int], width: int,
                         saves: int) -> tuple[list[float], list[float]]:
    """Forward+backward steps of ``model`` on a small batch, timed from a start while a
    background write runs (``saves`` asynchronous saves, each followed by steps until it is
    committed), and as many again with nothing in flight."""
    import torch

    import flashruntime.torch as ft

    batch = torch.randn(8, width)

    def step() -> float:
        t0 = time.perf_counter()
        model(batch).square().mean().backward()
        model.zero_grad(set_to_none=False)  # gradients kept: the step computes, it does not allocate
        return (time.perf_counter() - t0) * 1e3

    beside: list[float] = []
    for _ in range(saves):
        counter[0] += 1
        ft.checkpoint(model, optimizer, step=counter[0], async_save=True)
        beside.append(step())  # each step here starts while the write is in flight
        while not ft.wait_for_checkpoint(timeout=0):
            beside.append(step())
        shutil.rmtree(ckpt_root / f"step-{counter[0]:06d}")
    alone = [step() for _ in beside]
    return beside, alone


def _measure(label: str, layers: int, width: int, samples: int, base: Path):
    model, optimizer, params = _model_and_optimizer(layers, width)
    ckpt_root = base / f"ckpt-{label}"
    out_dir = base / f"out-{label}"
    ckpt_root.mkdir()
    out_dir.mkdir()
    env = {key: None for key in _ENV_KEYS}
    env.update(FLASHML_CKPT_DIR=str(ckpt_root), FLASHML_OUTPUT_DIR=str(out_dir))
    counter = [0]
    with _environment(env):
        ours_fn = _saver(model, optimizer, ckpt_root, counter, async_save=True)
        sync_fn = _saver(model, optimizer, ckpt_root, counter, async_save=False)
        sync_fn()  # first-call imports
        cold = ours_fn()  # allocates the host copy
        ours: list[Sample] = []
        sync: list[Sample] = []
        for index in range(samples):
            order = (sync_fn, ours_fn) if index % 4 in (0, 3) else (ours_fn, sync_fn)  # ABBA
            for fn in order:
                gc.collect()
                (ours if fn is ours_fn else sync).append(fn())
        beside, alone = _steps_beside_writes(model, optimizer, ckpt_root, counter, width, samples)
    return ours, sync, cold, params, (beside, alone)


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    sizes = SIZES[:1] if smoke else SIZES
    metrics = [(f"blocked_ms_per_save_{label}", f"ms_to_commit_{label}", f"step_ms_beside_write_{label}")
               for label, _, _ in sizes]
    if not torch_importable():
        reason = "torch is not importable here: ft.checkpoint needs it (skipped, never estimated)"
        return [skipped_row(NAME, SECTION, metric, "ms", reason) for pair in metrics for metric in pair]

    from benchmarks.host import filesystem_type

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="checkpoint_stall-", dir=WORK_DIR))
    rows = []
    try:
        fs = filesystem_type(base)
        for label, layers, width in sizes:
            ours, sync, cold, params, (beside, alone) = _measure(label, layers, width, samples, base)
            mib = params * 4 / (1 << 20)
            state = (f"state: {layers} x nn.Linear({width}, {width}) = {params:,} float32 parameters ({mib:.1f} MiB)"
                     f" + SGD momentum buffers of the same size after one step; files on {fs} under benchmarks/.work")
            order = (f"{len(ours)} sample(s) per side, ABBA order, after one discarded warm-up each; every sample"
                     " starts with no save in flight and writes a fresh step (removed afterwards)")
            notes = [
                ("ours = ft.checkpoint(model, optimizer, step=s, async_save=True), timed until it returns: the state"
                 " copied into host memory reused from the previous save, the background write started"),
                (f"comparator = {COMPARATOR}, the same call writing, fsyncing, hashing and committing on the training"
                 " thread"),
                state,
                order,
                (f"the first asynchronous save (the warm-up) held the thread {cold[0]:.1f} ms: it allocates the host"
                 " copy that later saves reuse"),
            ]
            if fs == "tmpfs":
                notes.append("warning: the work directory is on tmpfs, so fsync costs nothing here")
            target = CHECKPOINT_STALL_ASYNC_OVER_SYNC if label == "100mb" else None
            rows.append(measured_row(NAME, SECTION, f"blocked_ms_per_save_{label}", "ms", [b for b, _ in ours],
                                     comparator=(COMPARATOR, [b for b, _ in sync]), target=target, notes=notes))
            rows.append(measured_row(
                NAME, SECTION, f"ms_to_commit_{label}", "ms", [c for _, c in ours],
                comparator=(COMPARATOR, [c for _, c in sync]),
                notes=[("ours = from the asynchronous call until ft.wait_for_checkpoint() returned (the step"
                        " committed); the comparator's is its blocked time: the ratio is what the background write"
                        " costs beyond the synchronous save, with nothing else running"), state, order]))
            rows.append(measured_row(
                NAME, SECTION, f"step_ms_beside_write_{label}", "ms", beside,
                comparator=("the same step, no save in flight", alone),
                notes=[(f"ours = one forward and backward pass of the same model on a batch of 8, started while"
                        f" a background write runs ({len(beside)} steps beside {len(ours)} writes); the comparator"
                        " times as many with nothing in flight: the ratio is what the writing thread takes from"
                        " training on this host's 2 cores"), state]))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "An asynchronous ft.checkpoint holds the training thread for the copy of the state to host memory only:"
        " at most a tenth of the synchronous save of the same 100 MB state, which writes, fsyncs and hashes first."
    ),
    section=SECTION,
    run=run,
)
