"""One checkpoint step on disk: ``<checkpoint root>/step-<step:06d>/``, its parts written
through ``open_part`` (hashed while written) and committed by a manifest written last.

``checkpoint`` writes steps with it (on the training thread, or on a background thread from
a host copy of the state, see ``_async_save``) and the profiler times one save with the same
writer, so the measured cost is the cost of a real checkpoint.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.torch import _state

RESUME_PART = "resume.pt"


def unwrap(model: Any) -> Any:
    """The module inside a DistributedDataParallel (or similar ``.module``) wrapper."""
    inner = getattr(model, "module", None)
    return inner if inner is not None and hasattr(model, "require_backward_grad_sync") else model


def step_dir(step: int) -> Path:
    return _state.checkpoint_root() / f"step-{step:06d}"


def _framework_tag(version: str) -> str:
    return "pytorch-" + version.split("+", 1)[0]


def _cpu_state(module: Any) -> dict[str, Any]:
    return {
        key: value.detach().cpu() if hasattr(value, "detach") else value
        for key, value in module.state_dict().items()
    }


def _clear_unverified(directory: Path) -> None:
    """Make ``directory`` safe to (re)write: an unverified leftover is removed; a
    verified one loses its manifest first so it is never a checkpoint while parts change."""
    from flashruntime.checkpoint.local import MANIFEST_NAME, latest_valid_manifest

    if not directory.exists() and not directory.is_symlink():
        return
    if directory.is_dir() and latest_valid_manifest(directory.parent, pattern=directory.name) is not None:
        (directory / MANIFEST_NAME).unlink()
        return
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory)
    else:
        directory.unlink()


def capture_parts(model: Any, optimizer: Any, ranks: list[dict[str, Any]] | None = None, *,
                  to_cpu: bool = True) -> dict[str, Any]:
    """What step parts hold, by part name, as of now: the model's state (its tensors moved to
    the CPU with ``to_cpu``), the optimizer's when given, and with ``ranks`` (every rank's
    generator states) the resume part with the loader's position. Tensors are the live ones
    (CPU tensors are not copied): a caller that writes later copies them first."""
    module = unwrap(model)
    parts: dict[str, Any] = {"model.pt": _cpu_state(module) if to_cpu else module.state_dict()}
    if optimizer is not None:
        parts["optimizer.pt"] = optimizer.state_dict()
    if ranks is not None:
        parts[RESUME_PART] = resume_state(ranks)
    return parts


def resume_state(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The resume part: every rank's generator states and the position of ``prepare``'s loader."""
    loader = _state.STATE.loader
    return {"ranks": ranks, "loader": loader.state_dict() if loader is not None else None}


@dataclass(frozen=True)
class Destination:
    """Where a step goes and whose it is, read from the environment when the save is asked
    for, so a write finishing later on another thread commits what the call meant."""

    step: int
    directory: Path
    job_id: str
    attempt_id: str
    world_size: int
    loadable_world_sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, step: int) -> Destination:
        return cls(step, step_dir(step), os.environ.get("FLASHML_JOB_ID") or "local",
                   os.environ.get("FLASHML_ATTEMPT_ID") or "local", _state.world_size(),
                   tuple(_state.loadable_world_sizes()))


def write_parts(destination: Destination, parts: dict[str, Any]) -> None:
    """Write and commit one step: each of ``parts`` through ``open_part``, then the manifest."""
    import torch

    from flashruntime.checkpoint.local import open_part, write_manifest

    directory = destination.directory
    _clear_unverified(directory)
    directory.mkdir(parents=True, exist_ok=True)
    digests: dict[str, tuple[str, int]] = {}
    for name, value in parts.items():
        with open_part(directory, name) as part:
            torch.save(value, part)
        digests[name] = part.digest
    write_manifest(
        directory,
        job_id=destination.job_id,
        attempt_id=destination.attempt_id,
        step=destination.step,
        world_size=destination.world_size,
        framework=_framework_tag(torch.__version__),
        digests=digests,
        compatible_world_sizes=destination.loadable_world_sizes,
    )


def write_step(model: Any, optimizer: Any, step: int, ranks: list[dict[str, Any]] | None = None) -> None:
    """Write and commit step ``step``: the model, the optimizer when given, and with ``ranks``
    (every rank's generator states) the resume part that also holds the loader's position."""
    write_parts(Destination.of(step), capture_parts(model, optimizer, ranks))
