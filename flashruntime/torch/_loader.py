"""``ResumableLoader``: the data loader ``prepare`` hands back, which knows where it is.

It records the epoch and the batches handed out in it, so a checkpoint can say where the
data stood and a relaunch continues with the next batch, not the epoch's first. Its order
never draws on the global random generator: the shuffle is a ``DistributedSampler``'s
(seed and epoch; one replica for a single process) and the loader's worker seed has a
generator of its own, so restoring the global generator's state at a checkpoint gives a
resumed run the same dropout and the same batches as one that never stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["ResumableLoader", "is_loader"]

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


class _Skipping:
    """A sampler that drops its first ``skip`` indices once (the batches already seen)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        for index, value in enumerate(self.sampler):
            if index >= skip:
                yield value

    def __len__(self) -> int:
        return len(self.sampler)


class ResumableLoader:
    """A ``DataLoader`` over ``loader``'s dataset, batch size, collation and workers, with a
    ``DistributedSampler`` for ``world_size`` ranks (shuffled when ``loader`` shuffled), that
    keeps its position (``state_dict`` / ``load_state_dict``). Other attributes are the
    underlying loader's."""

    def __init__(self, loader: Any, world_size: int, rank: int) -> None:
        import torch
        from torch.utils.data import DataLoader, RandomSampler
        from torch.utils.data.distributed import DistributedSampler

        inner_sampler = loader.sampler
        shuffle = isinstance(inner_sampler, RandomSampler) or (
            isinstance(inner_sampler, DistributedSampler) and inner_sampler.shuffle)
        seed = inner_sampler.seed if isinstance(inner_sampler, DistributedSampler) else SEED
        self.sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                          seed=seed)
        self._skipping = _Skipping(self.sampler)
        workers = {"prefetch_factor": loader.prefetch_factor} if loader.num_workers > 0 else {}
        self._loader = DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=self._skipping, collate_fn=loader.collate_fn,
            num_workers=loader.num_workers, drop_last=loader.drop_last, pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers,
            timeout=loader.timeout, multiprocessing_context=loader.multiprocessing_context,
            generator=torch.Generator().manual_seed(seed), **workers,
        )
        self.epoch = 0
        self.position = 0  # batches of this epoch handed out
        self._resume_at = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        start, self._resume_at = self._resume_at, 0
        self._skipping.skip = start * (self._loader.batch_size or 1)
        self.position = start
        for batch in self._loader:
            self.position += 1
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        """Where the data stands: the epoch, the batches of it handed out, the global sample count."""
        consumed = (self.epoch * len(self._loader) + self.position) * (self._loader.batch_size or 1)
        return {"epoch": self.epoch, "position": self.position, "samples_per_rank": consumed,
                "world_size": self.sampler.num_replicas}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration starts at its epoch, after its batches."""
        self.epoch = int(state.get("epoch", 0))
        self._resume_at = int(state.get("position", 0))
        self.position = self._resume_at
