"""Profile mode of the in-script helper: when the profiler launches a script it sets
``FLASHML_PROFILE_WARMUP_STEPS`` and ``FLASHML_PROFILE_MEASURED_STEPS``; each
``log_metrics`` step is then timed, the data loader's waits are summed, and after the last
measured step one checkpoint is saved and restored, every rank writes
``profile-rank-<rank>.json`` into its output directory and the process exits 0.

Nothing happens without those variables: a normal run pays one dictionary lookup per step.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashruntime.torch import _async_save, _state, _step

ENV_WARMUP = "FLASHML_PROFILE_WARMUP_STEPS"
ENV_MEASURED = "FLASHML_PROFILE_MEASURED_STEPS"
PROFILE_FILE = "profile-rank-{rank}.json"


@dataclass
class ProfileState:
    """The marks of one profiled process: ``(step, perf_counter, loader wait so far, tokens)``
    per logged step, the first taken when ``prepare`` returns."""

    warmup: int
    measured: int
    marks: list[tuple[int, float, float, float | None]] = field(default_factory=list)
    loader_wait_s: float = 0.0
    model: Any = None
    optimizer: Any = None


PROFILE: ProfileState | None = None


def settings() -> tuple[int, int] | None:
    """``(warmup, measured)`` from the environment, None when this process is not profiled."""
    raw_measured = os.environ.get(ENV_MEASURED)
    if not raw_measured:
        return None
    warmup = int(os.environ.get(ENV_WARMUP) or "0")
    return warmup, int(raw_measured)


def _active() -> ProfileState | None:
    global PROFILE
    if PROFILE is None:
        chosen = settings()
        if chosen is None:
            return None
        PROFILE = ProfileState(warmup=chosen[0], measured=chosen[1])
    return PROFILE


class _TimedLoader:
    """Forwards to the wrapped loader and adds the time spent waiting for each batch to the
    profile; attribute access (``sampler``, ``dataset``, ``len``) reaches the loader itself."""

    def __init__(self, loader: Any, profile: ProfileState) -> None:
        self._loader = loader
        self._profile = profile

    def __iter__(self) -> Any:
        iterator = iter(self._loader)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self._profile.loader_wait_s += time.perf_counter() - started
                return
            self._profile.loader_wait_s += time.perf_counter() - started
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def attach(model: Any, optimizer: Any, loader: Any) -> Any:
    """Called by ``prepare`` as it returns: keep the model and optimizer for the checkpoint
    measurement, start the clock, and return the loader (timed when profiling)."""
    profile = _active()
    if profile is None:
        return loader
    profile.model, profile.optimizer = model, optimizer
    profile.marks = [(_state.STATE.start_step, time.perf_counter(), profile.loader_wait_s, None)]
    return None if loader is None else _TimedLoader(loader, profile)


def on_step(step: int, metrics: dict[str, Any]) -> None:
    """Called by ``log_metrics`` with an integer step: mark it; after warm-up + measured
    steps, measure a checkpoint, write this rank's profile and end the process."""
    profile = _active()
    if profile is None:
        return
    tokens = metrics.get("tokens")
    tokens = float(tokens) if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) else None
    now = time.perf_counter()
    if not profile.marks:  # a script without prepare: its first logged step is where the clock starts
        profile.marks.append((step, now, profile.loader_wait_s, None))
        return
    profile.marks.append((step, now, profile.loader_wait_s, tokens))
    if len(profile.marks) - 1 >= profile.warmup + profile.measured:
        _finish(profile, step)


def _barrier() -> None:
    if _state.world_size() > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()


def _peak_rss_gb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def _measure_checkpoint(profile: ProfileState, step: int) -> dict[str, float]:
    """One save through the helper's own writer and one restore of it, in the profile's
    checkpoint directory (never the job's)."""
    import torch

    started = time.perf_counter()
    _step.write_step(profile.model, profile.optimizer, step)
    saved = time.perf_counter()
    step_dir = _step.step_dir(step)
    device = _state.device()
    _step.unwrap(profile.model).load_state_dict(torch.load(step_dir / "model.pt", map_location=device))
    optimizer_part = step_dir / "optimizer.pt"
    if profile.optimizer is not None and optimizer_part.is_file():
        profile.optimizer.load_state_dict(torch.load(optimizer_part, map_location=device))
    restored = time.perf_counter()
    size = sum(part.stat().st_size for part in step_dir.iterdir() if part.is_file())
    return {"checkpoint_save_s": saved - started, "checkpoint_restore_s": restored - saved,
            "checkpoint_size_gb": size / 2**30}


def _peak_vram_gb() -> tuple[float | None, str | None]:
    device = _state.device()
    if device == "cpu":
        return None, None
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30, torch.cuda.get_device_name(device)


def _finish(profile: ProfileState, step: int) -> None:
    _barrier()  # every rank has finished its last measured step
    record: dict[str, Any] = {"rank": _state.rank(), "world_size": _state.world_size(), "device": _state.device(),
                              "warmup": profile.warmup, "measured": profile.measured,
                              "marks": profile.marks}
    if _state.is_main() and profile.model is not None:
        _async_save.SAVER.wait()  # a background save of this step would race the measured one
        record.update(_measure_checkpoint(profile, step))
    record["host_ram_gb"] = _peak_rss_gb()
    record["peak_vram_gb"], record["gpu_name"] = _peak_vram_gb()
    out = _state.output_dir()
    out.mkdir(parents=True, exist_ok=True)
    target = Path(out) / PROFILE_FILE.format(rank=_state.rank())
    partial = target.with_name(target.name + ".part")
    partial.write_text(json.dumps(record), encoding="utf-8")
    os.replace(partial, target)
    _barrier()  # no rank leaves while another still restores
    sys.stdout.flush()
    sys.stderr.flush()
    # The measurement is complete; the rest of the script (more steps, its own exit work) is
    # not run, and exiting here skips interpreter teardown that could wait on the process group.
    os._exit(0)
