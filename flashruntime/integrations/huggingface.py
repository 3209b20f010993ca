"""Hugging Face Trainer support: launch, resume lookup and a manifest-writing callback (SPEC §5.9).

The Trainer keeps its own ``checkpoint-<step>/`` directories; the callback adds a
verifying ``manifest.json`` to each, so ``latest_checkpoint`` returns only complete
ones for ``trainer.train(resume_from_checkpoint=...)``. transformers is imported
inside ``flashruntime_callback`` only.
"""

from __future__ import annotations

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
    """The newest ``checkpoint-*`` directory of ``output_dir`` with a verifying manifest,
    or None (pass it to ``Trainer.train(resume_from_checkpoint=...)``)."""
    from flashruntime.checkpoint.local import latest_valid_manifest

    manifest = latest_valid_manifest(output_dir, pattern="checkpoint-*")
    return None if manifest is None else manifest.storage_prefix


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
    step_dir = Path(args.output_dir) / f"checkpoint-{step}"
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
