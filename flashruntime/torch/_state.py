"""Per-process state of the in-script torch helper and its plain accessors.

Rank and world size come from the environment torchrun sets; device, backend and
the restored step are what the last ``prepare`` chose. Nothing here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class HelperState:
    """What ``prepare`` decided for this process; reset only by a new process."""

    start_step: int = 0
    device: str = "cpu"
    backend: str | None = None
    last_step: int | None = None  # last step reported through checkpoint/log_metrics
    last_beat: float | None = None  # monotonic time of the last heartbeat write
    atexit_registered: bool = False
    loader: Any = None  # the ResumableLoader prepare handed back, whose position checkpoints carry
    resume: Any = None  # the restored checkpoint's RNG states and data position, applied by prepare


STATE = HelperState()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; torchrun sets it to one") from None


def world_size() -> int:
    """``int(env WORLD_SIZE)``, 1 when unset."""
    return _env_int("WORLD_SIZE", 1)


def rank() -> int:
    """``int(env RANK)``, 0 when unset."""
    return _env_int("RANK", 0)


def local_rank() -> int:
    """``int(env LOCAL_RANK)``, 0 when unset."""
    return _env_int("LOCAL_RANK", 0)


def local_world_size() -> int:
    """``int(env LOCAL_WORLD_SIZE)``; without it every rank is taken to be on this node."""
    return _env_int("LOCAL_WORLD_SIZE", world_size())


def max_world_size() -> int:
    """The most ranks this run may be relaunched with: ``FLASHML_MAX_WORLD_SIZE`` (an elastic
    launch sets it), else this world size."""
    return max(world_size(), _env_int("FLASHML_MAX_WORLD_SIZE", 1))


def loadable_world_sizes() -> list[int]:
    """The world sizes a checkpoint of this process is listed as loading at: in an elastic run
    (``FLASHML_MAX_WORLD_SIZE`` set) every size up to it, since replicated (DDP) state and DCP's
    sharded state both load at any size; otherwise its own only."""
    if os.environ.get("FLASHML_MAX_WORLD_SIZE") is None:
        return [world_size()]
    return list(range(1, max_world_size() + 1))


def is_main() -> bool:
    """True on global rank 0."""
    return rank() == 0


def start_step() -> int:
    """The step restored by the last ``prepare`` (0 on a fresh start)."""
    return STATE.start_step


def device() -> str:
    """``"cpu"`` or ``"cuda:<LOCAL_RANK>"`` as chosen by ``prepare`` (``"cpu"`` before it)."""
    return STATE.device


def backend() -> str | None:
    """``"nccl"``, ``"gloo"``, or None for a single process."""
    return STATE.backend


def output_dir() -> Path:
    """``FLASHML_OUTPUT_DIR`` (the attempt directory), ``.`` when unset."""
    return Path(os.environ.get("FLASHML_OUTPUT_DIR") or ".")


def checkpoint_root() -> Path:
    """``FLASHML_CKPT_DIR``, else the job-scoped ``<output dir>/../ckpt``."""
    explicit = os.environ.get("FLASHML_CKPT_DIR")
    if explicit:
        return Path(explicit)
    return output_dir() / ".." / "ckpt"


def _resolve_device(world_size: int, cuda_available: bool, local_rank: int, device_count: int) -> str:
    """The device of one rank: ``"cpu"`` without CUDA, else ``"cuda:<local_rank>"``.

    NCCL refuses two ranks on one device, so a local rank without a visible device of
    its own is an error that names both numbers and the fix.
    """
    if not cuda_available:
        return "cpu"
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK {local_rank} is negative; torchrun sets it to 0..nproc_per_node-1")
    if local_rank < device_count:
        return f"cuda:{local_rank}"
    # world_size does not change the choice: a rank needs a device of its own either way.
    visible = f"{device_count} CUDA device is" if device_count == 1 else f"{device_count} CUDA devices are"
    raise ValueError(
        f"LOCAL_RANK {local_rank} but only {visible} visible; use nproc_per_node <= {device_count}, or gloo on CPU"
    )
