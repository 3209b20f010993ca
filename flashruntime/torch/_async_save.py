"""Checkpoints written off the training thread (``checkpoint(..., async_save=True)``).

The training thread copies the state into host memory and goes on; a background thread
writes, fsyncs and hashes the parts and commits the manifest last, so a crash mid-write
leaves the previous checkpoint the newest valid one. At most one save is in flight: the
next save first waits for it, and its host copy is reused. A failed background save is
raised at the next call; a pending one is finished at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import copy
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashruntime.errors import CheckpointError
from flashruntime.torch import _step

__all__ = ["SAVER", "BackgroundSaver", "HostStager", "background_save_failed"]

Writer = Callable[[_step.Destination, dict[str, Any]], None]


class HostStager:
    """Copies nested state (dicts, lists and tuples of tensors and plain values) into host
    memory it keeps, and reuses that memory at the next save of the same shapes: copying into
    pages already mapped costs a fraction of allocating fresh ones.

    A tensor on a CUDA device goes to pinned memory with a non-blocking copy, ordered on the
    device's current stream, so later kernels that change the parameters run after it; the
    returned events tell the writer when the bytes have arrived. Values that are neither
    containers nor tensors (the numbers, strings and None a state dict holds) are taken as
    they are; NumPy arrays are copied.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}

    @property
    def held_bytes(self) -> int:
        """Host memory the stager keeps for the next save."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())

    def stage(self, state: Any) -> tuple[Any, list[Any]]:
        """A host copy of ``state`` and the CUDA events to wait on before reading it (none
        when nothing came from a device). The previous copy's memory is reused, so the caller
        makes sure nothing reads it any more."""
        import torch

        copier = _Copier(torch, self._buffers)
        threads = torch.get_num_threads()
        # One thread copies memory about as fast as several, and on a busy host several wait at
        # their barrier for whichever lost its core: there one thread copies twice as fast.
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                staged = copier.copy(state, ())
        finally:
            torch.set_num_threads(threads)
        self._buffers = copier.buffers
        events = []
        for device in sorted(copier.devices, key=str):
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return staged, events


class _Copier:
    """One staging pass: the buffers it may reuse (by position in the state), those it used."""

    def __init__(self, torch: Any, previous: dict[tuple[Any, ...], Any]) -> None:
        self.torch = torch
        self.previous = previous
        self.buffers: dict[tuple[Any, ...], Any] = {}
        self.claimed: set[int] = set()  # ids of the buffers this pass filled
        self.aliases: dict[tuple[Any, ...], Any] = {}
        self.devices: set[Any] = set()

    def copy(self, value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, self.torch.Tensor):
            return self.tensor(value, path)
        if isinstance(value, dict):
            items = {key: self.copy(item, (*path, key)) for key, item in value.items()}
            return items if type(value) is dict else _like(value, items)
        if isinstance(value, list):
            return [self.copy(item, (*path, index)) for index, item in enumerate(value)]
        if isinstance(value, tuple):
            items = [self.copy(item, (*path, index)) for index, item in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            return value.copy()
        return value

    def tensor(self, value: Any, path: tuple[Any, ...]) -> Any:
        torch = self.torch
        tensor = value.detach()
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.to("cpu", copy=True)  # kinds a plain strided buffer cannot hold
        # The same view twice (tied weights) is copied once, as torch.save stores it once.
        alias = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if tensor.numel() and alias in self.aliases:
            return self.aliases[alias]
        pinned = tensor.is_cuda
        buffer = self.previous.get(path)
        if buffer is None or id(buffer) in self.claimed or buffer.shape != tensor.shape or (
                buffer.dtype != tensor.dtype) or (pinned and not buffer.is_pinned()):
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pinned)
        buffer.copy_(tensor, non_blocking=pinned)
        if pinned:
            self.devices.add(tensor.device)
        self.buffers[path] = buffer
        self.claimed.add(id(buffer))
        self.aliases[alias] = buffer
        return buffer


def _like(original: dict[Any, Any], items: dict[Any, Any]) -> dict[Any, Any]:
    """``items`` in the mapping type of ``original`` with its attributes (a module's
    ``state_dict`` carries ``_metadata``, which ``load_state_dict`` reads)."""
    try:
        mapping = type(original)()
        mapping.update(items)
    except TypeError:
        return items
    extra = getattr(original, "__dict__", None)
    if extra:
        mapping.__dict__.update(copy.deepcopy(extra))
    return mapping


@dataclass
class _Save:
    destination: _step.Destination
    thread: threading.Thread | None = None
    error: BaseException | None = None


@dataclass
class BackgroundSaver:
    """One process's background saves: ``submit`` stages and starts one, ``wait`` finishes
    it, ``raise_failure`` reports a save that failed. Called from the training thread."""

    write: Writer = _step.write_parts
    stager: HostStager = field(default_factory=HostStager)
    _pending: _Save | None = None
    _failed: collections.deque[_Save] = field(default_factory=collections.deque)
    _exit_hook: bool = False

    @property
    def pending_step(self) -> int | None:
        """The step being written in the background, None when none is."""
        save = self._pending
        if save is None or save.thread is None or not save.thread.is_alive():
            return None
        return save.destination.step

    def submit(self, destination: _step.Destination, parts: dict[str, Any]) -> None:
        """Copy ``parts`` to host memory now and write them as ``destination`` in the
        background, after the save in flight (waited for first) and any failure it had
        (raised) are settled."""
        self.wait()
        self.raise_failure()
        staged, events = self.stager.stage(parts)
        save = _Save(destination)
        save.thread = threading.Thread(target=self._run, args=(save, staged, events), daemon=True,
                                       name=f"flashruntime-checkpoint-{destination.step}")
        self._pending = save
        if not self._exit_hook:
            atexit.register(self.finish_at_exit)
            self._exit_hook = True
        save.thread.start()

    def _run(self, save: _Save, staged: dict[str, Any], events: list[Any]) -> None:
        try:
            for event in events:
                event.synchronize()
            self.write(save.destination, staged)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread at its next call
            save.error = error
            _discard_uncommitted(save.destination)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight; False when ``timeout`` seconds passed first."""
        save = self._pending
        if save is None:
            return True
        if save.thread is not None:
            save.thread.join(timeout)
            if save.thread.is_alive():
                return False
        self._settle(save)
        return True

    def _settle(self, save: _Save) -> None:
        self._pending = None
        if save.error is not None:
            self._failed.append(save)

    def raise_failure(self) -> None:
        """Raise ``CheckpointError`` for a background save that failed and was not reported yet."""
        save = self._pending
        if save is not None and save.thread is not None and not save.thread.is_alive():
            self._settle(save)
        if not self._failed:
            return
        failed = self._failed.popleft()
        self._failed.clear()  # one report: the first failure is the cause of any that followed
        raise background_save_failed(failed.destination, failed.error)

    def finish_at_exit(self) -> None:
        """Finish the save in flight before the interpreter goes; a failure is printed, as
        nothing is left to raise it to."""
        step = self.pending_step
        if step is not None:
            print(f"flashruntime: finishing the checkpoint of step {step} before exit", file=sys.stderr, flush=True)
        self.wait()
        try:
            self.raise_failure()
        except CheckpointError as error:
            print(f"flashruntime: {error}", file=sys.stderr, flush=True)


def background_save_failed(destination: _step.Destination, error: BaseException | None) -> CheckpointError:
    """The error a background save that failed is reported with, at the next call."""
    failure = CheckpointError(
        f"the background save of checkpoint step {destination.step} to {str(destination.directory)!r} failed: "
        f"{error!r}; it was not committed, so the checkpoint before it is still the newest valid one")
    failure.__cause__ = error
    return failure


def _discard_uncommitted(destination: _step.Destination) -> None:
    """Remove the parts of a step whose save failed before its manifest: they can never
    verify, and a save that failed for want of space should give the space back."""
    from flashruntime.checkpoint.local import MANIFEST_NAME

    directory = destination.directory
    if directory.is_dir() and not directory.is_symlink() and not (directory / MANIFEST_NAME).exists():
        shutil.rmtree(directory, ignore_errors=True)


SAVER = BackgroundSaver()

