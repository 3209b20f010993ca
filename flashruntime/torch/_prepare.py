"""``prepare``: device placement, process group, DDP wrapping and restore.

One call at the top of a training script turns a plain model/optimizer/loader into
their distributed versions when torchrun started several ranks, and restores the
latest verified checkpoint of the job so a relaunch continues where it stopped.
"""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from flashruntime.errors import CheckpointError
from flashruntime.torch import _compute_time, _heartbeat, _preempt, _profile, _rng, _sharded, _state
from flashruntime.torch._loader import ResumableLoader, is_loader
from flashruntime.torch._step import unwrap


def _destroy_group_at_exit() -> None:
    # No barrier here: a dead peer would make it hang. Scripts end with their own barrier.
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def _step_dir_of(root: Path, manifest: Any) -> Path:
    """Where the verified parts of ``manifest`` are: the directory under this root that
    holds it (the tree may have moved since it was written), else its ``storage_prefix``."""
    from flashruntime.protocol.v1alpha1 import CheckpointManifest

    named = root / f"step-{manifest.step:06d}"
    for candidate in [named, *sorted(root.glob("step-*"))]:
        try:
            found = CheckpointManifest.model_validate_json((candidate / "manifest.json").read_bytes())
        except (OSError, ValueError):
            continue
        if found.manifest_id == manifest.manifest_id:
            return candidate
    return Path(manifest.storage_prefix)


def _select_manifest(root: Path, multi_node: bool, device: str) -> Any:
    """The manifest every rank restores: its own latest on one node; rank 0's step,
    broadcast, on several (a rank that does not see it verified raises)."""
    from flashruntime.checkpoint.local import latest_valid_manifest

    if not multi_node:
        return latest_valid_manifest(root)

    import torch
    import torch.distributed as dist

    mine = latest_valid_manifest(root) if _state.rank() == 0 else None
    chosen = torch.tensor([mine.step if mine is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(chosen, src=0)
    step = int(chosen.item())
    if step == 0:
        return None
    manifest = mine if mine is not None else latest_valid_manifest(root, pattern=f"step-{step:06d}")
    # Every rank learns whether all of them can restore, so they fail together instead
    # of the healthy ones hanging in their first collective.
    ok = torch.tensor([1 if manifest is not None else 0], dtype=torch.int64, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if manifest is None:
        raise CheckpointError(
            f"rank {_state.rank()} cannot restore step {step}: rank 0 selected it but {str(root)!r} holds no verified "
            f"step-{step:06d} here; multi-node resume needs a checkpoint_dir visible to every participant "
            "(flash.submit(..., checkpoint_dir=<shared path>))"
        )
    if int(ok.item()) == 0:
        raise CheckpointError(
            f"another rank cannot restore step {step} selected by rank 0; multi-node resume needs a checkpoint_dir "
            "visible to every participant (flash.submit(..., checkpoint_dir=<shared path>))"
        )
    return manifest


def _restore(model: Any, optimizer: Any, device: str, multi_node: bool) -> int:
    import torch

    root = _state.checkpoint_root()
    manifest = _select_manifest(root, multi_node, device)
    if manifest is None:
        return 0
    step_dir = _step_dir_of(root, manifest)
    if _sharded.is_dcp_step(manifest):  # written through DCP: resharded to this world size as it loads
        _sharded.restore(model, optimizer, step_dir)
    else:
        state = torch.load(step_dir / "model.pt", map_location=device)
        unwrap(model).load_state_dict(state)
        optimizer_part = step_dir / "optimizer.pt"
        if optimizer is not None and optimizer_part.is_file():
            optimizer.load_state_dict(torch.load(optimizer_part, map_location=device))
    resume_part = step_dir / "resume.pt"
    if "resume.pt" in {Path(part.key).name for part in manifest.parts} and resume_part.is_file():
        # Tensors, lists and numbers only (see _rng.capture): nothing else is unpickled.
        _state.STATE.resume = torch.load(resume_part, map_location="cpu", weights_only=True)
    return int(manifest.step)


def _apply_resume(loader: Any) -> None:
    """Continue the data where the checkpoint left it and put this rank's generators back as
    they were then (last, so nothing of prepare's own draws from them afterwards)."""
    resume = _state.STATE.resume
    _state.STATE.resume = None
    if not isinstance(resume, dict):
        return
    if isinstance(loader, ResumableLoader) and isinstance(resume.get("loader"), dict):
        loader.load_state_dict(resume["loader"])
    # At another world size a rank that existed then takes its generators back; a new one keeps its own.
    mine = [entry for entry in resume.get("ranks") or [] if isinstance(entry, dict)
            and entry.get("rank") == _state.rank()]
    if mine:
        _rng.restore(mine[0]["rng"])


_NOT_GIVEN: Any = object()


def prepare(model: Any, optimizer: Any = None, dataloader: Any = _NOT_GIVEN) -> tuple[Any, ...]:
    """Place, wrap and restore: returns ``(model, optimizer, dataloader)``, or ``(model,
    optimizer)`` when called without a dataloader (``model, opt = ft.prepare(model, opt)``).

    Device from ``LOCAL_RANK`` and CUDA; with ``WORLD_SIZE > 1`` the default process
    group (nccl on CUDA, else gloo) and DistributedDataParallel. A ``DataLoader`` comes
    back as a ``ResumableLoader`` over the same dataset and batches (DistributedSampler's
    order, seed 0, one replica for a single process; shuffled when the original shuffled),
    whose global position checkpoints record. Then the latest verified checkpoint of the job
    is loaded, at this world size whatever size wrote it (replicated state as it is, DCP's
    sharded state resharded), the loader continues after the samples every rank together had
    consumed (at another world size the ranks share the rest of the epoch, with the per-rank
    batch that keeps the global batch; see ``ResumableLoader``), this rank's random
    generators are put back as they were, and ``start_step()`` reports the step. A single
    CPU process is otherwise a pass-through.
    """
    _preempt.arm()  # first: a notice during the rendezvous or the restore is kept for the first checkpoint call
    given_loader = dataloader is not _NOT_GIVEN
    dataloader = dataloader if given_loader else None
    import torch

    state = _state.STATE
    cuda = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if cuda else 0
    world = _state.world_size()
    device = _state._resolve_device(world, cuda, _state.local_rank(), count)
    state.device = device
    if device != "cpu":
        torch.cuda.set_device(device)
        model = model.to(device)

    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if dist.is_initialized():
            state.backend = str(dist.get_backend())  # the script's own group wins
        else:
            state.backend = "nccl" if device != "cpu" else "gloo"
            dist.init_process_group(backend=state.backend)
            if not state.atexit_registered:
                atexit.register(_destroy_group_at_exit)
                state.atexit_registered = True
        if _sharded.is_sharded(model):
            pass  # sharded by the script (FSDP2's fully_shard): it needs no DDP around it
        elif device != "cpu":
            index = torch.device(device).index
            model = DistributedDataParallel(model, device_ids=[index], output_device=index)
        else:
            model = DistributedDataParallel(model)
    else:
        state.backend = None
    if is_loader(dataloader):
        dataloader = ResumableLoader(dataloader, world, _state.rank() if world > 1 else 0)
    state.loader = dataloader if isinstance(dataloader, ResumableLoader) else None

    multi_node = world > _state.local_world_size()
    state.start_step = _restore(model, optimizer, device, multi_node)
    state.last_step = state.start_step
    if world > 1:  # each rank's compute time, which the straggler watch compares
        _compute_time.attach(model, optimizer)
    _heartbeat.beat(state.start_step, force=True)
    _apply_resume(state.loader)
    dataloader = _profile.attach(model, optimizer, dataloader)  # unchanged unless the profiler runs this
    return (model, optimizer, dataloader) if given_loader else (model, optimizer)
