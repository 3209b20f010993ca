"""Elastic local runs, decided without a process: the torchrun command rewritten at a world
size (and the options it refuses), the GPUs a relaunch can have (``CUDA_VISIBLE_DEVICES``
against what ``nvidia-smi`` lists), the wait for a lost slot's known return on a fake clock,
the ``WORLD_SIZE_CHANGED`` words, and the sweeps ``submit`` refuses before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.cli.dispatch import main
from flashruntime.errors import InvalidSubmission
from flashruntime.local.attempts import _elastic_world
from flashruntime.local.elastic import Capacity, ElasticRanks, argv_at, size_change
from flashruntime.local.visible_gpus import VisibleGpus, usable_gpus, visible_entries
from flashruntime.workloads.command import CommandWorkload, Source
from tests._support import FakeClock

UUIDS = ["GPU-0a1b2c3d-0000", "GPU-4e5f6a7b-1111", "GPU-8c9d0e1f-2222", "GPU-23456789-3333"]
FOUR = [(index, uuid) for index, uuid in enumerate(UUIDS)]


# --- the torchrun rewrite -------------------------------------------------------------------------

@pytest.mark.parametrize("restarts", [["--max-restarts=0"], ["--max_restarts", "0"], ["--max-r=0"]])
def test_torchruns_own_restarts_at_zero_are_kept(restarts: list[str]) -> None:
    argv = ["torchrun", *restarts, "--nproc-per-node=2", "train.py", "--max-restarts", "5"]
    assert argv_at(argv, 1) == ["torchrun", *restarts, "--nproc-per-node=1", "train.py", "--max-restarts", "5"]


@pytest.mark.parametrize(("restarts", "shown"), [
    (["--max-restarts=3"], "--max-restarts 3"), (["--max_restarts", "2"], "--max_restarts 2"),
    (["--max=4"], "--max 4"),
])
def test_torchruns_own_restarts_are_refused_naming_where_they_belong(restarts: list[str], shown: str) -> None:
    value = shown.split()[-1]
    with pytest.raises(InvalidSubmission, match=re.escape(
            f"torchrun's {shown} would restart them inside the attempt at the old size: drop {shown.split()[0]} from "
            f"the command and give the run the restarts instead (max_restarts={value} to submit, --max-restarts "
            f"{value} to flashruntime submit)")):
        argv_at(["torchrun", "--standalone", *restarts, "train.py"], 2)


@pytest.mark.parametrize("nodes", [["--nnodes=1"], ["--nnodes", "1:1"], ["--nn=1"]])
def test_one_node_is_kept(nodes: list[str]) -> None:
    assert argv_at(["torchrun", *nodes, "--nproc_per_node", "4", "train.py"], 3) == [
        "torchrun", *nodes, "--nproc-per-node=3", "train.py"]


@pytest.mark.parametrize(("nodes", "shown"), [
    (["--nnodes=2"], "--nnodes 2"), (["--nnodes", "1:2"], "--nnodes 1:2"), (["--nno=2:4"], "--nno 2:4"),
])
def test_several_nodes_are_refused_pointing_at_torchruns_own_range(nodes: list[str], shown: str) -> None:
    with pytest.raises(InvalidSubmission, match=re.escape(
            f"torchrun's {shown} spreads the job over several: drop {shown.split()[0]} (or give --nnodes=1), or drop "
            "ranks and let torchrun itself resize a multi-node job with --nnodes=MIN:MAX")):
        argv_at(["python", "-m", "torch.distributed.run", *nodes, "--nproc-per-node=2", "train.py"], 2)


def test_options_that_only_look_alike_are_carried_as_they_are() -> None:
    argv = ["torchrun", "--master-addr", "127.0.0.1", "--master_port=29400", "--node-rank", "0", "--np", "8",
            "-r3", "--standalone", "train.py", "--nnodes", "4"]
    assert argv_at(argv, 2) == ["torchrun", "--master-addr", "127.0.0.1", "--master_port=29400", "--node-rank", "0",
                                "--nproc-per-node=2", "-r3", "--standalone", "train.py", "--nnodes", "4"]


# --- the GPUs a relaunch can have ----------------------------------------------------------------

@pytest.mark.parametrize(("visible", "listed", "count", "words"), [
    (None, None, None, ""),
    (None, FOUR, 4, "nvidia-smi lists 4 GPUs"),
    ("0,2", FOUR, 2, "CUDA_VISIBLE_DEVICES='0,2' makes 2 of the 4 GPUs nvidia-smi lists visible"),
    ("1", FOUR[:2], 1, "CUDA_VISIBLE_DEVICES='1' makes 1 of the 2 GPUs nvidia-smi lists visible"),
    ("0,7,1", FOUR, 1, "CUDA_VISIBLE_DEVICES='0,7,1' makes 1 of the 4 GPUs"),  # 7 names none: CUDA stops there
    ("0,-1,1", FOUR, 1, "makes 1 of the 4"),
    ("GPU-4e5f,GPU-8c9d0e1f-2222", FOUR, 2, "makes 2 of the 4"),  # UUIDs and their prefixes
    ("1,GPU-4e5f", FOUR, 1, "makes 1 of the 4"),  # the same device named twice counts once
    ("GPU-ffff", FOUR, 0, "makes 0 of the 4"),
    ("", FOUR, 0, "CUDA_VISIBLE_DEVICES='' makes 0 of the 4"),
    ("0,1,2,3", FOUR[:2], 2, "makes 2 of the 2"),  # more named than the machine has
    ("MIG-aaaa,MIG-bbbb", FOUR[:1], 2, "makes 2 of the 1 GPU nvidia-smi lists visible"),
    ("0,1,2", None, 3, "CUDA_VISIBLE_DEVICES='0,1,2' names 3 GPUs"),  # no nvidia-smi: the entries as they stand
    ("-1", None, 0, "names 0 GPUs"),
])
def test_usable_gpus_narrows_what_nvidia_smi_lists_to_what_cuda_visible_devices_names(
        visible: str | None, listed: list[tuple[int, str]] | None, count: int | None, words: str) -> None:
    got, why = usable_gpus(visible, listed)
    assert got == count
    assert words in why


def test_a_cpu_workload_is_never_capped_by_gpus() -> None:
    assert VisibleGpus.of(None, {}, {"CUDA_VISIBLE_DEVICES": "0"}) is None  # the process's own: not a GPU job
    assert VisibleGpus.of(0, {"CUDA_VISIBLE_DEVICES": "-1"}, {}) is None  # it hides the GPUs from its ranks
    assert VisibleGpus.of(0, {"CUDA_VISIBLE_DEVICES": ""}, {}) is None
    assert visible_entries("-1") == []


def test_a_gpu_workload_sees_its_own_cuda_visible_devices_else_the_process_one() -> None:
    assert VisibleGpus.of(1, {}, {}) == VisibleGpus(None)
    assert VisibleGpus.of(1, {}, {"CUDA_VISIBLE_DEVICES": "2,3"}) == VisibleGpus("2,3")
    assert VisibleGpus.of(1, {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "2,3"}) == VisibleGpus("0")
    assert VisibleGpus.of(None, {"CUDA_VISIBLE_DEVICES": "0,1"}, {}) == VisibleGpus("0,1")  # naming GPUs asks for them


def test_capacity_is_the_smaller_of_the_slots_left_and_the_gpus_visible() -> None:
    listed = list(FOUR)
    gpus = VisibleGpus("0,1,2", listing=lambda: listed)
    capacity = Capacity(ElasticRanks(1, 4), gpus=gpus, clock=lambda: 0.0)
    first = capacity.now()
    assert (first.count, first.why) == (3, "CUDA_VISIBLE_DEVICES='0,1,2' makes 3 of the 4 GPUs nvidia-smi lists visible")
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)")
    capacity.withdraw("rank 2's slot lost (chaos lose_rank)")
    assert capacity.now().count == 2  # the slots are the tighter limit now; the GPUs add no reason
    assert capacity.now().why == "rank 1's slot lost (chaos lose_rank); rank 2's slot lost (chaos lose_rank)"
    del listed[1:]  # GPUs 1..3 fell off the bus: read again at every relaunch
    assert (capacity.now().count, capacity.now().why.endswith("makes 1 of the 1 GPU nvidia-smi lists visible")) == (
        1, True)


# --- choosing the size, waiting for a known return ------------------------------------------------

class _Events:
    """What ``_elastic_world`` needs of a run: somewhere to record its events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def record_event(self, kind: str, message: str) -> None:
        self.events.append((kind, message))


def test_below_min_with_a_timed_loss_waits_for_the_slots_return_and_relaunches() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(2, 2), clock=clock)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)", seconds=3)
    run = _Events()
    world = _elastic_world(run, capacity, "task-000-r1", 2, sleep=clock.sleep)  # type: ignore[arg-type]
    assert world == 2
    assert 2.99 < sum(clock.sleeps) < 3.5  # until the return, not the whole bound
    assert run.events == [("WORLD_SIZE_WAITING", ("task-000-r1 waits up to 8 s for 2 ranks: 1 available (rank 1's "
                                                 "slot lost (chaos lose_rank)), and a lost slot returns in 3 s"))]


def test_below_min_without_a_known_return_fails_at_once() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(3, 3), clock=clock)
    capacity.withdraw("rank 2's slot lost (chaos lose_rank)", seconds=30)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)")  # for good: the 30 s return alone is not enough
    run = _Events()
    assert _elastic_world(run, capacity, "task-000-r1", 3, sleep=clock.sleep) is None  # type: ignore[arg-type]
    assert clock.sleeps == []
    assert run.events == [("WORLD_SIZE_UNAVAILABLE", (
        "task-000-r1 not launched: 1 rank available (rank 2's slot lost (chaos lose_rank); rank 1's slot lost "
        "(chaos lose_rank)), fewer than the 3 the run needs at least (3..3 ranks)"))]


def test_the_wait_ends_with_the_first_return_that_brings_min() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(1, 2), clock=clock)
    capacity.withdraw("rank 0's slot lost (chaos lose_rank)", seconds=2)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)", seconds=4)
    run = _Events()
    assert _elastic_world(run, capacity, "task-000-r1", 2, sleep=clock.sleep) == 1  # type: ignore[arg-type]
    assert 1.99 < sum(clock.sleeps) < 2.5  # one slot back is enough for min 1
    assert run.events[-1] == ("WORLD_SIZE_CHANGED", ("task-000-r1 runs 1 rank instead of 2: rank 1's slot lost "
                                                    "(chaos lose_rank)"))


def test_a_stop_ends_the_wait() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(2, 2), clock=clock)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)", seconds=60)
    halts = iter([False, False, True])
    run = _Events()
    assert _elastic_world(run, capacity, "task-000-r1", 2, sleep=clock.sleep,  # type: ignore[arg-type]
                          halted=lambda: next(halts)) is None
    assert len(clock.sleeps) == 2
    assert [kind for kind, _ in run.events] == ["WORLD_SIZE_WAITING"]  # stopped: not a failure of capacity


def test_no_wait_when_the_gpus_are_what_is_missing() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(1, 2), gpus=VisibleGpus(None, listing=list), clock=clock)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)", seconds=3)
    assert capacity.now(1).back_in is None  # the slot returns, but no GPU is listed to run it on
    run = _Events()
    assert _elastic_world(run, capacity, "task-000-r1", 2, sleep=clock.sleep) is None  # type: ignore[arg-type]
    assert clock.sleeps == []
    assert run.events == [("WORLD_SIZE_UNAVAILABLE", (
        "task-000-r1 not launched: 0 ranks available (rank 1's slot lost (chaos lose_rank); nvidia-smi lists 0 GPUs), "
        "fewer than the 1 the run needs at least (1..2 ranks)"))]


def test_a_wait_that_outlasts_its_bound_fails_saying_it_waited() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(1, 1), clock=clock)
    capacity.withdraw("rank 0's slot lost (chaos lose_rank)", seconds=1)
    run = _Events()

    def lost_again(seconds: float) -> None:  # the slot is lost anew each time it is about to return
        clock.sleep(seconds)
        capacity.withdraw("rank 0's slot lost (chaos lose_rank)", seconds=0.5)

    assert _elastic_world(run, capacity, "task-000-r1", 1, sleep=lost_again) is None  # type: ignore[arg-type]
    assert 5.99 < sum(clock.sleeps) < 6.5  # the first known return (1 s) and the grace, no more
    assert run.events[-1] == ("WORLD_SIZE_UNAVAILABLE", (
        "task-000-r1 not launched: 0 ranks available (rank 0's slot lost (chaos lose_rank)) after waiting 6 s for "
        "the lost slot's return, fewer than the 1 the run needs at least (1..1 ranks)"))


@pytest.mark.parametrize(("previous", "world", "maximum", "words"), [
    (None, 2, 2, None),
    (None, 1, 2, "task-000 starts with 1 rank instead of 2 (the run's max): nvidia-smi lists 1 GPU"),
    (2, 1, 2, "task-000 runs 1 rank instead of 2: nvidia-smi lists 1 GPU"),
    (1, 2, 2, "task-000 runs 2 ranks instead of 1: 2 of 2 ranks available again"),
    (1, 2, 3, "task-000 runs 2 ranks instead of 1: grew to 2 of max 3, 1 slot still missing (nvidia-smi lists 1 GPU)"),
    (1, 2, 4, "task-000 runs 2 ranks instead of 1: grew to 2 of max 4, 2 slots still missing (nvidia-smi lists 1 GPU)"),
    (2, 2, 3, None),
])
def test_world_size_changed_says_what_happened(previous: int | None, world: int, maximum: int,
                                               words: str | None) -> None:
    assert size_change("task-000", previous, world, maximum, "nvidia-smi lists 1 GPU") == words


def test_a_partial_grow_names_the_slot_still_missing() -> None:
    clock = FakeClock()
    capacity = Capacity(ElasticRanks(1, 3), clock=clock)
    capacity.withdraw("rank 2's slot lost (chaos lose_rank)", seconds=5)
    capacity.withdraw("rank 1's slot lost (chaos lose_rank)")
    run = _Events()
    assert _elastic_world(run, capacity, "task-000-r1", 3, sleep=clock.sleep) == 1  # type: ignore[arg-type]
    clock.now += 6  # rank 2's slot is back, rank 1's is not
    assert _elastic_world(run, capacity, "task-000-r2", 1, sleep=clock.sleep) == 2  # type: ignore[arg-type]
    assert run.events == [
        ("WORLD_SIZE_CHANGED", ("task-000-r1 runs 1 rank instead of 3: rank 2's slot lost (chaos lose_rank); rank 1's "
                               "slot lost (chaos lose_rank)")),
        ("WORLD_SIZE_CHANGED", ("task-000-r2 runs 2 ranks instead of 1: grew to 2 of max 3, 1 slot still missing "
                               "(rank 1's slot lost (chaos lose_rank))")),
    ]


def test_a_first_attempt_below_max_says_so() -> None:
    capacity = Capacity(ElasticRanks(1, 2), gpus=VisibleGpus("0", listing=lambda: list(FOUR)))
    run = _Events()
    assert _elastic_world(run, capacity, "task-000", None) == 1  # type: ignore[arg-type]
    assert run.events == [("WORLD_SIZE_CHANGED", ("task-000 starts with 1 rank instead of 2 (the run's max): "
                                                 "CUDA_VISIBLE_DEVICES='0' makes 1 of the 4 GPUs nvidia-smi lists "
                                                 "visible"))]


# --- sweeps ---------------------------------------------------------------------------------------

def test_an_elastic_sweep_running_trials_at_once_is_refused(tmp_path: Path) -> None:
    workload = CommandWorkload(command="python train.py --lr {lr}", source=Source(path=str(tmp_path)),
                               task_params=[{"lr": 0.1}, {"lr": 0.2}])
    with pytest.raises(InvalidSubmission, match=re.escape(
            "ranks=(min, max) gives each attempt every rank slot of this machine, so the 2 trials of a sweep cannot "
            "run 2 at once (max_concurrent_trials=2, --parallel 2) without sharing them: run the trials one at a "
            "time (max_concurrent_trials=1, or no --parallel), or drop ranks")):
        flash.submit(workload, output_dir=tmp_path / "run", watch=False, quiet=True, ranks=(1, 2),
                     max_concurrent_trials=2)
    assert not (tmp_path / "run").exists()


def test_the_cli_refuses_ranks_with_parallel_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["submit", "python train.py --lr {lr}", "--source", str(tmp_path), "--task-params",
                 '[{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]', "--ranks", "1:2", "--parallel", "3", "--no-watch",
                 "--quiet", "--output-dir", str(tmp_path / "run")])
    assert code != 0
    assert "the 3 trials of a sweep cannot run 3 at once" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
