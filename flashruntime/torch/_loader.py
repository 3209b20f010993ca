"""``ResumableLoader``: the data loader ``prepare`` hands back, which knows where it is.

It records where the epoch stands in the data as a whole (the epoch, and the samples of the
epoch's global order every rank together has consumed), not a per-rank offset, so a
checkpoint says where the data stood whatever the world size, and a relaunch continues with
the next sample, on as many ranks as it has: after a resume at another world size the ranks
share exactly the samples of the epoch not seen yet, none skipped and none repeated, and the
per-rank batch changes so the global batch stays what it was when it divides evenly. A
``drop_last`` loader also records where its epoch ends (the samples its last full batches
reach), so a resumed epoch never yields the samples the epoch dropped.

``len(loader)`` is always the batches of a whole epoch at the loader's world size and batch,
wherever the epoch stands: what a scheduler or Trainer computing steps per epoch needs.

Its order never draws on the global random generator: an epoch's global order is a
permutation of the dataset seeded by the seed and the epoch (``DistributedSampler``'s), rank
``r`` of ``W`` takes every ``W``-th sample of it from ``r``, and the loader's worker seed has a
generator of its own, so restoring the global generator's state at a checkpoint gives a
resumed run the same dropout and the same batches as one that never stopped.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["ElasticSampler", "ResumableLoader", "is_loader", "resharded_batch"]

SEED = 0


def is_loader(value: Any) -> bool:
    """A ``DataLoader`` this module can stand in for without changing what it yields: a
    map-style dataset, batches of ``batch_size`` drawn by a plain sequential, random or
    distributed sampler, no sampler generator of its own. Any other loader is left as it is."""
    try:
        from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
        from torch.utils.data.distributed import DistributedSampler
    except ImportError:  # pragma: no cover - prepare needs torch anyway
        return False
    if not isinstance(value, DataLoader) or isinstance(value.dataset, IterableDataset) or value.batch_size is None:
        return False
    sampler = value.sampler
    if type(sampler) not in (SequentialSampler, RandomSampler, DistributedSampler):
        return False
    return not (isinstance(sampler, RandomSampler) and (sampler.generator is not None or sampler.replacement
                                                         or sampler._num_samples is not None))


def resharded_batch(global_batch: int, batch_size: int, world_size: int) -> int:
    """The per-rank batch at ``world_size`` ranks: the one that keeps ``global_batch`` when it
    divides evenly, else the script's own ``batch_size`` (the global batch then changes)."""
    return global_batch // world_size if global_batch % world_size == 0 else batch_size


class ElasticSampler:
    """One rank's share of an epoch's global order from ``offset`` on.

    The global order is ``DistributedSampler``'s: a permutation seeded by ``seed + epoch``
    (the dataset's order without ``shuffle``). From ``offset`` (the samples of the epoch
    consumed before a resume, 0 otherwise) the rest is padded by repeating its start up to a
    multiple of ``num_replicas`` (as ``DistributedSampler`` pads the epoch), and rank ``rank``
    takes every ``num_replicas``-th sample of it. With ``offset=0`` it yields exactly what
    ``DistributedSampler`` yields. ``skip`` drops this rank's first samples once (the batches
    handed out before a resume at the same world size).

    ``end`` (with an offset): where the epoch's samples stop, for a ``drop_last`` loader whose
    epoch dropped its tail; the rest from ``offset`` is then cut to a multiple of
    ``num_replicas`` instead of padded, so no sample is repeated either.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool, seed: int) -> None:
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self.end: int | None = None  # None: the dataset's end, the rest padded
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _remaining(self) -> list[int]:
        import torch

        size = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(size, generator=generator).tolist()
        else:
            order = list(range(size))
        if self.offset == 0:  # the whole epoch, padded as DistributedSampler pads it
            return _padded(order, math.ceil(size / self.num_replicas) * self.num_replicas)
        if self.end is not None:  # a drop_last epoch's rest, to its end (which may lie in its padding): cut
            rest = _padded(order, self.end)[self.offset:self.end]
            return rest[:len(rest) - len(rest) % self.num_replicas]
        rest = order[self.offset:]
        return _padded(rest, math.ceil(len(rest) / self.num_replicas) * self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        share = self._remaining()[self.rank::self.num_replicas]
        return iter(share[skip:])

    def __len__(self) -> int:
        size = len(self.dataset)
        if self.offset == 0:
            return math.ceil(size / self.num_replicas)
        if self.end is not None:
            return max(0, self.end - self.offset) // self.num_replicas if size else 0
        return math.ceil(max(0, size - self.offset) / self.num_replicas)


def _padded(order: list[int], total: int) -> list[int]:
    """``order`` repeated from its start up to ``total`` samples, as ``DistributedSampler`` pads."""
    if not order or len(order) >= total:
        return order
    return order + (order * math.ceil((total - len(order)) / len(order)))[:total - len(order)]


class ResumableLoader:
    """A ``DataLoader`` over ``loader``'s dataset, batch size, collation and workers, drawing
    through an ``ElasticSampler`` for ``world_size`` ranks (shuffled when ``loader`` shuffled),
    that keeps its position in the epoch's global order (``state_dict`` / ``load_state_dict``).
    Other attributes are the underlying loader's."""

    def __init__(self, loader: Any, world_size: int, rank: int) -> None:
        from torch.utils.data import RandomSampler
        from torch.utils.data.distributed import DistributedSampler

        inner_sampler = loader.sampler
        shuffle = isinstance(inner_sampler, RandomSampler) or (
            isinstance(inner_sampler, DistributedSampler) and inner_sampler.shuffle)
        self.seed = inner_sampler.seed if isinstance(inner_sampler, DistributedSampler) else SEED
        self.sampler = ElasticSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                      seed=self.seed)
        self._original = loader
        self.script_batch_size = int(loader.batch_size)
        self.global_batch = self.script_batch_size * world_size
        self._loader = self._build(self.script_batch_size)
        self.epoch = 0
        self.position = 0  # batches of this epoch handed out since its offset
        self._resume_at = 0
        self.resharded: dict[str, int] | None = None  # what a resume at another world size changed

    def _build(self, batch_size: int) -> Any:
        import torch
        from torch.utils.data import DataLoader

        loader = self._original
        workers = {"prefetch_factor": loader.prefetch_factor} if loader.num_workers > 0 else {}
        return DataLoader(
            loader.dataset, batch_size=batch_size, sampler=self.sampler, collate_fn=loader.collate_fn,
            num_workers=loader.num_workers, drop_last=loader.drop_last, pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers,
            timeout=loader.timeout, multiprocessing_context=loader.multiprocessing_context,
            generator=torch.Generator().manual_seed(self.seed), **workers,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    @property
    def batch_size(self) -> int:
        return int(self._loader.batch_size)

    def __len__(self) -> int:
        """The batches of a whole epoch at this world size and batch, as the script's own loader
        would count them, whether or not this epoch was resumed part way: schedulers and Trainers
        that compute steps per epoch from ``len(loader)`` get the same figure before and after a
        resume (a resumed epoch yields only its remaining batches)."""
        per_rank = math.ceil(len(self.sampler.dataset) / self.sampler.num_replicas)
        return per_rank // self.batch_size if self._original.drop_last else math.ceil(per_rank / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        start, self._resume_at = self._resume_at, 0
        self.sampler.skip = start * self.batch_size
        self.position = start
        for batch in self._loader:
            self.position += 1
            yield batch
        self.epoch += 1
        self.position = 0
        self.sampler.offset, self.sampler.end = 0, None  # a resumed epoch's bounds end with it

    def _epoch_end(self) -> int:
        """Where this epoch's samples stop in its (padded) global order: the dataset's end, or for
        a ``drop_last`` loader where its full batches reach (the rest is dropped)."""
        if not self._original.drop_last:
            return len(self.sampler.dataset)
        batches = len(self.sampler) // self.batch_size  # this epoch's, from its offset
        return self.sampler.offset + batches * self.batch_size * self.sampler.num_replicas

    def state_dict(self) -> dict[str, int]:
        """Where the data stands, at any world size: the epoch, the samples of its global order
        consumed by all ranks together (``samples``), where its samples stop (``end``: the
        dataset's end, or a ``drop_last`` epoch's last full batch), and how this run reads it
        (world size, per-rank and global batch, and the offset and batches handed out since)."""
        world = self.sampler.num_replicas  # global_batch: what the run asks for, kept where it divides
        consumed = self.sampler.offset + self.position * self.batch_size * world
        return {"epoch": self.epoch, "samples": min(consumed, self.sampler.offset + len(self.sampler) * world),
                "end": self._epoch_end(), "offset": self.sampler.offset, "position": self.position,
                "world_size": world, "batch_size": self.batch_size, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration starts at its epoch, after the samples it
        had consumed. At the world size and batch it was saved with, the same batches follow;
        at another world size the ranks share the rest of the epoch's global order, each with
        the batch that keeps the global batch when it divides evenly."""
        self.epoch = int(state.get("epoch", 0))
        world = self.sampler.num_replicas
        saved_world = int(state.get("world_size", world))
        saved_batch = int(state.get("batch_size", self.script_batch_size))
        position = int(state.get("position", 0))
        target = self.global_batch = int(state.get("global_batch", saved_batch * saved_world))
        batch = resharded_batch(target, self.script_batch_size, world)
        if batch != self.batch_size:
            self._loader = self._build(batch)
        end = state.get("end")
        # Only a drop_last epoch stops short of the dataset's end; the others pad their rest.
        self.sampler.end = int(end) if end is not None and self._original.drop_last else None
        if saved_world == world and saved_batch == batch:  # the same layout: the same batches follow
            self.sampler.offset = int(state.get("offset", 0))
            self._resume_at = self.position = position
            return
        offset = int(state.get("offset", 0))
        self.sampler.offset = int(state.get("samples", offset + position * saved_batch * saved_world))
        self._resume_at = self.position = 0
        now = batch * world  # the run keeps asking for ``target``: a later size that divides it gets it back
        self.resharded = {"epoch": self.epoch, "samples": self.sampler.offset, "from_world_size": saved_world,
                          "world_size": world, "from_batch_size": saved_batch, "batch_size": batch,
                          "from_global_batch": saved_batch * saved_world, "global_batch": now}
        if self.sampler.rank == 0:
            kept = (f"global batch {target} kept" if now == target
                    else f"global batch {target} -> {now} ({target} does not divide by {world} ranks)")
            print(f"flashruntime: data resharded from {saved_world} to {world} ranks in epoch {self.epoch} after "
                  f"{self.sampler.offset} samples: per-rank batch {saved_batch} -> {batch}, {kept}",
                  file=sys.stderr, flush=True)
