"""The loader ``flashruntime.torch.prepare`` hands back, resumed at the same and at another world
size: ``len(loader)`` is the whole epoch's batches at its layout either way, and a resumed epoch
yields exactly the samples not taken yet, ``drop_last`` included. Every rank's loader is a real
``ResumableLoader`` over a real ``DataLoader``; the reference is ``DistributedSampler``'s."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from flashruntime.torch._loader import ResumableLoader

pytestmark = pytest.mark.torch


def _dataset(size: int) -> Any:
    return TensorDataset(torch.arange(size))


def _ranks(size: int, world: int, batch: int, drop_last: bool, state: dict[str, Any] | None = None) -> list[Any]:
    """One ``ResumableLoader`` per rank of ``world``, each loaded from ``state`` when given."""
    loaders = []
    for rank in range(world):
        loader = ResumableLoader(DataLoader(_dataset(size), batch_size=batch, shuffle=True, drop_last=drop_last),
                                 world, rank)
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    return loaders


def _steps(loaders: list[Any], stop_after: int | None = None) -> tuple[list[list[int]], dict[str, Any]]:
    """The global batches of one epoch (every rank's ids at each step) until ``stop_after`` steps,
    and rank 0's state there (a checkpoint inside the loop, after that step)."""
    iterators = [iter(loader) for loader in loaders]
    steps: list[list[int]] = []
    state = loaders[0].state_dict()
    while stop_after is None or len(steps) < stop_after:
        batches = [next(it, None) for it in iterators]
        if all(batch is None for batch in batches):
            break
        assert all(batch is not None for batch in batches), "the ranks yielded different numbers of batches"
        steps.append([i for batch in batches for i in batch[0].tolist()])
        state = loaders[0].state_dict()
    return steps, state


def _reference_epoch(size: int, world: int, batch: int, drop_last: bool, epoch: int) -> list[list[int]]:
    """An epoch as ``DistributedSampler`` and a plain ``DataLoader`` give it at ``world`` ranks."""
    per_rank = []
    for rank in range(world):
        sampler = DistributedSampler(_dataset(size), num_replicas=world, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        per_rank.append([b[0].tolist() for b in DataLoader(_dataset(size), batch_size=batch, sampler=sampler,
                                                         drop_last=drop_last)])
    return [[i for rank in step for i in rank] for step in zip(*per_rank)]


def _plain_len(size: int, world: int, batch: int, drop_last: bool) -> int:
    sampler = DistributedSampler(_dataset(size), num_replicas=world, rank=0)
    return len(DataLoader(_dataset(size), batch_size=batch, sampler=sampler, drop_last=drop_last))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("world", "resumed_world"), [(2, 2), (2, 1), (4, 3)])
def test_len_is_the_whole_epoch_at_the_loaders_layout_before_and_after_a_resume(
        drop_last: bool, world: int, resumed_world: int) -> None:
    size, batch = 40, 2
    before = _ranks(size, world, batch, drop_last)
    assert len(before[0]) == _plain_len(size, world, batch, drop_last)
    taken, state = _steps(before, stop_after=3)
    after = _ranks(size, resumed_world, batch, drop_last, state)
    # Resumed part way into the epoch (after 3 steps), len still counts the whole epoch at the new layout.
    assert len(after[0]) == _plain_len(size, resumed_world, after[0].batch_size, drop_last)
    rest, _ = _steps(after)
    assert 0 < len(rest) < len(after[0])  # the resumed epoch itself yields only what is left of it
    assert len(after[0]) == _plain_len(size, resumed_world, after[0].batch_size, drop_last)  # and after it
    if resumed_world == world:
        assert len(taken) + len(rest) == len(after[0])


@pytest.mark.parametrize(("size", "world", "batch", "resumed_world"),
                         [(12, 4, 2, 3), (12, 4, 2, 2), (28, 4, 2, 3), (30, 3, 4, 2), (20, 2, 3, 1)])
def test_drop_last_checkpoint_at_an_epochs_last_batch_resumes_into_the_next_epoch_at_a_smaller_size(
        size: int, world: int, batch: int, resumed_world: int) -> None:
    first = _ranks(size, world, batch, drop_last=True)
    epoch, state = _steps(first, stop_after=len(first[0]))  # the checkpoint after the epoch's last batch
    assert epoch == _reference_epoch(size, world, batch, True, epoch=0)
    resumed = _ranks(size, resumed_world, batch, True, state)
    rest, _ = _steps(resumed)
    assert rest == []  # nothing of epoch 0 was left: the samples drop_last dropped stay dropped
    following, _ = _steps(resumed)
    assert following == _reference_epoch(size, resumed_world, resumed[0].batch_size, True, epoch=1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resumed_epoch_yields_exactly_the_samples_not_taken_yet_at_any_size(drop_last: bool) -> None:
    for size, world, batch, resumed_world in itertools.product((11, 16, 23), (2, 3, 4), (1, 2, 3), (1, 2, 3, 4)):
        first = _ranks(size, world, batch, drop_last)
        whole = _reference_epoch(size, world, batch, drop_last, epoch=0)
        for cut in range(1, len(first[0]) + 1):
            taken, state = _steps(_ranks(size, world, batch, drop_last), stop_after=cut)
            assert taken == whole[:cut]
            resumed = _ranks(size, resumed_world, batch, drop_last, state)
            rest, _ = _steps(resumed)
            seen = Counter(i for step in taken + rest for i in step)
            case = (size, world, batch, resumed_world, cut)
            if resumed_world == world:  # the same layout: the very batches an uninterrupted epoch yields
                assert taken + rest == whole, case
                continue
            kept = resumed[0].batch_size * resumed_world == batch * world
            if not drop_last:  # every sample at least once; only the padding of a rest repeats some
                assert set(seen) == set(range(size)), case
                continue
            # drop_last: no sample more often than the uninterrupted epoch takes it (which repeats only
            # its padding), nothing of what it dropped, and with the global batch kept exactly its samples
            uninterrupted = Counter(i for step in whole for i in step)
            assert not seen - uninterrupted, case
            if kept:
                assert seen == uninterrupted, case
            assert all(len(step) == resumed[0].batch_size * resumed_world for step in rest), case
