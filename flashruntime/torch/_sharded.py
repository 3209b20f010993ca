"""Sharded state (a model whose parameters are DTensors, as FSDP2's ``fully_shard`` makes
them) checkpointed through PyTorch Distributed Checkpoint (DCP), under flashruntime's
manifest.

Every rank writes its own shards into the step's directory (DCP's files: a ``.distcp`` per
rank and the ``.metadata`` index); rank 0 then adds the resume part (every rank's random
generators and the loader's position) and writes ``manifest.json`` last, over every file,
so a step is a checkpoint only once all of it is on disk and hashed. DCP reshards on load,
so the step restores at any world size, on a sharded model or a plain one.

With ``async_save`` DCP copies the state to host memory and writes it on a background
thread, over a process group of its own (gloo), so its collectives never interleave with
training's; rank 0 commits the manifest once DCP has written the ``.metadata`` (which it
does only after every rank's shards are written). At most one save is in flight.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashruntime.torch import _async_save, _state, _step

__all__ = ["SHARDED", "is_dcp_step", "is_sharded", "restore", "save"]


def is_sharded(model: Any) -> bool:
    """Whether any parameter of ``model`` is a DTensor (FSDP2, tensor parallelism)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    parameters = getattr(_step.unwrap(model), "parameters", None)
    return callable(parameters) and any(isinstance(parameter, DTensor) for parameter in parameters())


def is_dcp_step(manifest: Any) -> bool:
    """Whether a manifest's parts are a DCP checkpoint (they hold its ``.metadata``)."""
    from flashruntime.checkpoint.local import DCP_METADATA_NAME

    return any(Path(part.key).name == DCP_METADATA_NAME for part in manifest.parts)


def _state_dicts(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(_step.unwrap(model))}
    model_state, optimizer_state = get_state_dict(_step.unwrap(model), optimizer)
    return {"model": model_state, "optim": optimizer_state}


def _barrier(group: Any = None) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def _commit(destination: _step.Destination, resume: dict[str, Any] | None) -> None:
    """Rank 0, once every shard and DCP's index are written: the resume part, then the manifest."""
    import torch

    from flashruntime.checkpoint.local import open_part, write_manifest

    directory = destination.directory
    digests: dict[str, tuple[str, int]] = {}
    if resume is not None:
        with open_part(directory, _step.RESUME_PART) as part:
            torch.save(resume, part)
        digests[_step.RESUME_PART] = part.digest
    write_manifest(directory, job_id=destination.job_id, attempt_id=destination.attempt_id, step=destination.step,
                   world_size=destination.world_size, framework=_step._framework_tag(torch.__version__),
                   digests=digests, compatible_world_sizes=destination.loadable_world_sizes)


def _prepare_directory(destination: _step.Destination) -> None:
    """Rank 0 empties the step's directory (a verified step there loses its manifest first);
    then every rank may write into it."""
    if _state.is_main():
        _step._clear_unverified(destination.directory)
        destination.directory.mkdir(parents=True, exist_ok=True)
    _barrier()


@dataclass
class _Pending:
    future: Any
    destination: _step.Destination
    committer: threading.Thread | None = None
    error: BaseException | None = None


@dataclass
class ShardedSaves:
    """This process's sharded saves: at most one in flight; its failure raised at the next call."""

    group: Any = None  # the process group of background saves, made at the first one (collective)
    pending: _Pending | None = None
    failed: list[_Pending] = field(default_factory=list)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for this rank's part of the save in flight (and on rank 0 its commit)."""
        pending = self.pending
        if pending is None:
            return True
        if pending.committer is not None:
            pending.committer.join(timeout)
            if pending.committer.is_alive():
                return False
        else:
            try:
                pending.future.result(timeout=timeout)
            except TimeoutError:
                return False
            except BaseException as error:  # noqa: BLE001 - raised at the next call
                pending.error = error
        self.pending = None
        if pending.error is not None:
            self.failed.append(pending)
        return True

    def raise_failure(self) -> None:
        if not self.failed:
            return
        failed = self.failed[0]
        self.failed.clear()
        raise _async_save.background_save_failed(failed.destination, failed.error)

    def _commit_when_written(self, pending: _Pending, resume: dict[str, Any] | None) -> None:
        try:
            pending.future.result()
            _commit(pending.destination, resume)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread at its next call
            pending.error = error

    def submit(self, destination: _step.Destination, model: Any, optimizer: Any, resume: dict[str, Any] | None,
               ) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if self.group is None and dist.is_available() and dist.is_initialized():
            self.group = dist.new_group(backend="gloo")  # collective: every rank saves at this step
        _prepare_directory(destination)
        future = dcp.async_save(_state_dicts(model, optimizer), checkpoint_id=os.fspath(destination.directory),
                                process_group=self.group)
        pending = _Pending(future, destination)
        if _state.is_main():
            pending.committer = threading.Thread(target=self._commit_when_written, args=(pending, resume),
                                                 daemon=True, name=f"flashruntime-checkpoint-{destination.step}")
            pending.committer.start()
        self.pending = pending


SHARDED = ShardedSaves()


def save(destination: _step.Destination, model: Any, optimizer: Any, resume: dict[str, Any] | None, *,
         background: bool) -> None:
    """Save ``destination``'s step of a sharded model on every rank (collective); rank 0's
    ``resume`` (every rank's generators, the loader's position) goes into the resume part."""
    SHARDED.wait()
    SHARDED.raise_failure()
    if background:
        SHARDED.submit(destination, model, optimizer, resume)
        return
    import torch.distributed.checkpoint as dcp

    _prepare_directory(destination)
    dcp.save(_state_dicts(model, optimizer), checkpoint_id=os.fspath(destination.directory))
    if _state.is_main():
        _commit(destination, resume)


def restore(model: Any, optimizer: Any, step_dir: Path) -> None:
    """Load a DCP step into ``model`` (and ``optimizer``) at this world size: DCP reshards
    what the ranks that saved it wrote. Collective when the model is sharded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    module = _step.unwrap(model)
    state = _state_dicts(module, optimizer)
    dcp.load(state, checkpoint_id=os.fspath(step_dir))
    if optimizer is None or "optim" not in state:
        set_model_state_dict(module, state["model"])
    else:
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
