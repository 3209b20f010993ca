"""Hugging Face Trainer support: launch, resume lookup and a manifest-writing callback.

The Trainer keeps its own ``checkpoint-<step>/`` directories; the callback adds a
verifying ``manifest.json`` to each, so ``latest_checkpoint`` returns only complete
ones for ``trainer.train(resume_from_checkpoint=...)``. transformers is imported
inside ``flashruntime_callback`` only.
"""

from __future__ import annotations

import glob
import os
import warnings
from pathlib import Path
from typing import Any

from flashruntime.integrations.pytorch import ddp
from flashruntime.workloads.command import CommandWorkload

__all__ = ["flashruntime_callback", "latest_checkpoint", "trainer"]


def trainer(script: str, *, source: str = ".", nproc_per_node: int = 1, script_args: str = "") -> CommandWorkload:
    """A Trainer script under single-node torchrun (``ddp`` with ``nnodes=1``)."""
    return ddp(script, source=source, nproc_per_node=nproc_per_node, nnodes=1, script_args=script_args)


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-*`` directory of ``output_dir`` with a verifying manifest
    (absolute), or None (pass it to ``Trainer.train(resume_from_checkpoint=...)``).

    The path is where the manifest was found, not the ``storage_prefix`` it records: that
    may be relative to another working directory, or the tree may have moved since."""
    from flashruntime.checkpoint.local import latest_valid_manifest

    try:
        root = os.path.abspath(os.fspath(output_dir))
    except TypeError:  # not a path at all: nothing to resume, as before
        return None
    manifest = latest_valid_manifest(root, pattern="checkpoint-*")
    return None if manifest is None else _directory_holding(root, manifest)


def _directory_holding(root: str, manifest: Any) -> str | None:
    """The first ``checkpoint-*`` directory of ``root``, in the order the scan uses, whose
    own manifest is ``manifest`` and verifies (None if the tree changed meanwhile)."""
    from flashruntime.checkpoint.local import MANIFEST_NAME, verify_manifest
    from flashruntime.protocol.v1alpha1 import CheckpointManifest

    for path in sorted(glob.glob(os.path.join(glob.escape(root), "checkpoint-*", MANIFEST_NAME))):
        try:
            with open(path, "rb") as f:
                found = CheckpointManifest.model_validate_json(f.read())
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            continue
        step_dir = os.path.dirname(path)
        same = (found.manifest_id, found.step) == (manifest.manifest_id, manifest.step)
        if same and verify_manifest(found, step_dir):
            return step_dir
    return None


def _is_world_main(state: Any) -> bool:
    flag = getattr(state, "is_world_process_zero", None)
    if isinstance(flag, bool):
        return flag
    from flashruntime.torch import is_main

    return is_main()


def write_trainer_manifest(args: Any, state: Any) -> None:
    """Commit ``<args.output_dir>/checkpoint-<global_step>/`` with a manifest (rank 0)."""
    from flashruntime.checkpoint.local import write_manifest

    if not _is_world_main(state):
        return
    step = int(state.global_step)
    # Absolute, so the manifest's storage_prefix holds from any working directory.
    step_dir = Path(os.path.abspath(args.output_dir)) / f"checkpoint-{step}"
    if not step_dir.is_dir():
        return
    try:
        write_manifest(
            step_dir,
            job_id=os.environ.get("FLASHML_JOB_ID") or "local",
            attempt_id=os.environ.get("FLASHML_ATTEMPT_ID") or "local",
            step=step,
            world_size=max(1, int(getattr(args, "world_size", 1) or 1)),
            framework="transformers",
        )
    except (OSError, ValueError) as exc:
        # Training goes on; this step just will not be offered for resume.
        warnings.warn(f"flashruntime: no manifest for {step_dir}: {exc}", RuntimeWarning, stacklevel=2)


def forward_logs(state: Any, logs: dict[str, Any] | None) -> None:
    """Send Trainer logs plus ``step`` to ``flashruntime.torch.log_metrics``."""
    from flashruntime.torch import log_metrics

    log_metrics({**(logs or {}), "step": int(state.global_step)})


def flashruntime_callback() -> Any:
    """A ``transformers.TrainerCallback`` that writes manifests on save and forwards logs."""
    from transformers import TrainerCallback

    class FlashRuntimeCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        """Manifests for Trainer checkpoints; logs into metrics.jsonl."""

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            write_trainer_manifest(args, state)
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            forward_logs(state, logs)
            return control

    return FlashRuntimeCallback()
