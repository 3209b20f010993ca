"""One checkpoint step on disk: ``<checkpoint root>/step-<step:06d>/``, its parts written
through ``open_part`` (hashed while written) and committed by a manifest written last.

``checkpoint`` writes steps with it and the profiler times one save with the same writer,
so the measured cost is the cost of a real checkpoint.
"""

from __future__ import annotations

import os
import shutil
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


def write_step(model: Any, optimizer: Any, step: int, ranks: list[dict[str, Any]] | None = None) -> None:
    """Write and commit step ``step``: the model, the optimizer when given, and with ``ranks``
    (every rank's generator states) the resume part that also holds the loader's position."""
    import torch

    from flashruntime.checkpoint.local import open_part, write_manifest

    directory = step_dir(step)
    _clear_unverified(directory)
    directory.mkdir(parents=True, exist_ok=True)
    digests: dict[str, tuple[str, int]] = {}
    with open_part(directory, "model.pt") as part:
        torch.save(_cpu_state(unwrap(model)), part)
    digests["model.pt"] = part.digest
    if optimizer is not None:
        with open_part(directory, "optimizer.pt") as part:
            torch.save(optimizer.state_dict(), part)
        digests["optimizer.pt"] = part.digest
    if ranks is not None:
        loader = _state.STATE.loader
        resume = {"ranks": ranks, "loader": loader.state_dict() if loader is not None else None}
        with open_part(directory, RESUME_PART) as part:
            torch.save(resume, part)
        digests[RESUME_PART] = part.digest
    write_manifest(
        directory,
        job_id=os.environ.get("FLASHML_JOB_ID") or "local",
        attempt_id=os.environ.get("FLASHML_ATTEMPT_ID") or "local",
        step=step,
        world_size=_state.world_size(),
        framework=_framework_tag(torch.__version__),
        digests=digests,
    )
