"""An elastic local run (``ranks=(1, 2)``) of a 2-rank ``flashruntime.torch`` script under real
torchrun and gloo: a rank lost for good at step k costs a relaunch on the one rank left, from
the newest checkpoint, and when the slot comes back the next relaunch has two ranks again.
Every sample of every epoch is seen exactly once across both changes (the script logs the
sample ids of each step), and the run ends where the same script ends when its world size is
changed by hand at the same steps from the same checkpoints."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.errors import InvalidSubmission
from flashruntime.launchers import LaunchState
from flashruntime.local.chaos import ChaosPlan, Fault
from flashruntime.providers import Requirements
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT
from tests.integration._torchrun import torchrun_argv

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SAMPLES, PER_RANK_BATCH, TOTAL = 64, 4, 48  # 2 ranks: 8 steps an epoch, 6 epochs

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft
    from torch.utils.data import DataLoader, TensorDataset

    total, stop_at, pace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    torch.manual_seed(0)
    n = %(samples)d
    data = TensorDataset(torch.arange(n), torch.randn(n, 8), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=%(batch)d, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = ft.prepare(model, optimizer, loader)
    out = os.environ["FLASHML_OUTPUT_DIR"]
    seen = open(os.path.join(out, f"samples-rank{ft.rank()}.jsonl"), "a")
    step = ft.start_step()
    while step < total and step != stop_at:
        for ids, x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            seen.write(json.dumps({"step": step, "epoch": loader.epoch, "ids": ids.tolist()}) + "\\n")
            seen.flush()
            ft.log_metrics({"step": step, "loss": loss.item(), "world_size": ft.world_size()})
            ft.checkpoint(model, optimizer, step=step, every=4)
            if step >= total or step == stop_at:
                break
            time.sleep(pace)
    if ft.is_main():
        weights = [round(float(p.detach().sum()), 10) for p in model.parameters()]
        json.dump({"final_loss": loss.item(), "weights": weights, "step": step},
                  open(os.path.join(out, "metrics.json"), "w"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""") % {"samples": SAMPLES, "batch": PER_RANK_BATCH}


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def _by_hand(tmp_path: Path, name: str, ranks: int, ckpt: Path, stop_at: int) -> Path:
    """The script run directly at ``ranks`` ranks from the checkpoints in ``ckpt``."""
    out = tmp_path / name
    out.mkdir()
    launcher = [sys.executable] if ranks == 1 else [*torchrun_argv(), f"--nproc-per-node={ranks}", "--standalone",
                                                    "--local-addr=127.0.0.1"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLASHML_")}
    env.update(_env(), FLASHML_OUTPUT_DIR=str(out), FLASHML_CKPT_DIR=str(ckpt), FLASHML_JOB_ID=name,
               FLASHML_ATTEMPT_ID=name)
    done = subprocess.run([*launcher, str(tmp_path / "src" / "train.py"), str(TOTAL), str(stop_at), "0"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _resumed_steps(run: flash.Run) -> list[int]:
    steps = []
    for event in run.events:
        found = re.search(r"-r\d+ resumes from step (\d+)", event["message"])
        if event["type"] == "RESUME_SELECTED" and found:
            steps.append(int(found.group(1)))
    return steps


def test_a_rank_lost_for_good_continues_on_one_and_grows_back_seeing_every_sample_once(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", str(TOTAL),
               str(TOTAL), "0.25"]
    workload = CommandWorkload(command=command, source=Source(path=str(source)), env=_env(),
                               outputs=OutputSpec(collect=[]))
    chaos = ChaosPlan(faults=[Fault(kind="lose_rank", rank=1, at_step=10, seconds=4),
                              Fault(kind="kill_rank", rank=0, at_step=36)])
    run = flash.submit(workload, output_dir=tmp_path / "elastic", watch=False, quiet=True, max_restarts=2,
                       chaos=chaos, ranks=(1, 2))
    assert run.state is LaunchState.SUCCEEDED, run.logs(150)
    sizes = [attempt["world_size"] for attempt in run.attempts]
    assert sizes == [2, 1, 2], (sizes, run.events)
    changes = [event["message"] for event in run.events if event["type"] == "WORLD_SIZE_CHANGED"]
    assert changes == [
        "task-000-r1 runs 1 rank instead of 2: rank 1's slot lost (chaos lose_rank)",
        "task-000-r2 runs 2 ranks instead of 1: 2 of 2 ranks available again",
    ], run.events
    first, second = resumed = _resumed_steps(run)
    assert 8 <= first <= 12 and first % 4 == 0, resumed  # the newest checkpoint, not step 0
    assert 32 <= second <= 40 and second % 4 == 0, resumed
    assert "data resharded from 2 to 1 ranks" in run.logs(2000)
    ledger = run.goodput()  # the time at each size: steps kept at 2 ranks and at 1, all of the run's
    assert [size for size, _, _ in ledger.world_sizes] == [2, 1]
    assert sum(steps for _, _, steps in ledger.world_sizes) == ledger.steps == TOTAL
    assert all(useful > 0 for _, useful, _ in ledger.world_sizes)

    # Exactly once: each epoch's 64 samples, across both changes of world size.
    timeline: dict[int, list[int]] = {}
    bounds = [0, *resumed, TOTAL]
    for index, attempt in enumerate(run.attempts):
        for path in Path(attempt["output_dir"]).glob("samples-rank*.jsonl"):
            for record in map(json.loads, path.read_text().splitlines()):
                if bounds[index] < record["step"] <= bounds[index + 1]:
                    timeline.setdefault(record["step"], []).extend(record["ids"])
    assert sorted(timeline) == list(range(1, TOTAL + 1))
    steps_per_epoch = SAMPLES // (2 * PER_RANK_BATCH)
    for epoch in range(TOTAL // steps_per_epoch):
        ids = [i for step in range(epoch * steps_per_epoch + 1, (epoch + 1) * steps_per_epoch + 1)
               for i in timeline[step]]
        assert Counter(ids) == Counter(range(SAMPLES)), (epoch, sorted(Counter(ids).items()))
    assert all(len(timeline[step]) == 2 * PER_RANK_BATCH for step in timeline)  # the global batch kept

    # The same changes made by hand, from the same checkpoints, end in the same place.
    ckpt = run.output_dir / "local" / "ckpt"
    reference = tmp_path / "reference-ckpt"
    reference.mkdir()
    shutil.copytree(ckpt / f"step-{first:06d}", reference / f"step-{first:06d}")
    _by_hand(tmp_path, "by-hand-1", 1, reference, stop_at=second)
    by_hand = json.loads((_by_hand(tmp_path, "by-hand-2", 2, reference, stop_at=TOTAL) / "metrics.json").read_text())
    ours = json.loads((Path(run.attempts[-1]["output_dir"]) / "metrics.json").read_text())
    assert ours["step"] == by_hand["step"] == TOTAL
    assert ours["final_loss"] == pytest.approx(by_hand["final_loss"], abs=1e-6)
    assert ours["weights"] == pytest.approx(by_hand["weights"], abs=1e-6)


def test_a_run_below_its_fewest_ranks_fails_saying_so(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    workload = CommandWorkload(command=[sys.executable, "train.py", str(TOTAL), str(TOTAL), "0.25"],
                               source=Source(path=str(source)), env=_env(), outputs=OutputSpec(collect=[]),
                               ranks=(2, 2))  # the workload's own range, as ddp(nproc_per_node=(min, max)) gives it
    chaos = ChaosPlan(faults=[Fault(kind="lose_rank", rank=1, at_step=6)])
    run = flash.submit(workload, output_dir=tmp_path / "too-few", watch=False, quiet=True, max_restarts=2,
                       chaos=chaos)
    assert run.state is LaunchState.FAILED
    assert [attempt["world_size"] for attempt in run.attempts] == [2]
    unavailable = [event["message"] for event in run.events if event["type"] == "WORLD_SIZE_UNAVAILABLE"]
    assert unavailable == [("task-000-r1 not launched: 1 rank available (rank 1's slot lost (chaos lose_rank)), "
                            "fewer than the 2 the run needs at least (2..2 ranks)")]


def test_a_timed_loss_below_the_fewest_ranks_waits_for_the_slot_and_relaunches_at_full_size(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", "16",
               "16", "0.25"]
    workload = CommandWorkload(command=command, source=Source(path=str(source)), env=_env(),
                               outputs=OutputSpec(collect=[]))
    chaos = ChaosPlan(faults=[Fault(kind="lose_rank", rank=1, at_step=6, seconds=10)])
    run = flash.submit(workload, output_dir=tmp_path / "waits", watch=False, quiet=True, max_restarts=1,
                       chaos=chaos, ranks=(2, 2))
    assert run.state is LaunchState.SUCCEEDED, (run.events, run.logs(100))
    assert [attempt["world_size"] for attempt in run.attempts] == [2, 2]
    kinds = [event["type"] for event in run.events]
    assert "WORLD_SIZE_UNAVAILABLE" not in kinds and "WORLD_SIZE_CHANGED" not in kinds, run.events
    waiting = [event["message"] for event in run.events if event["type"] == "WORLD_SIZE_WAITING"]
    assert len(waiting) == 1 and waiting[0].startswith("task-000-r1 waits up to "), run.events
    assert "for 2 ranks: 1 available (rank 1's slot lost (chaos lose_rank)), and a lost slot returns in" in waiting[0]
    [resumed] = _resumed_steps(run)  # from its newest checkpoint, once the slot was back
    assert 4 <= resumed <= 8 and resumed % 4 == 0, run.events


def test_a_gpu_run_starts_with_the_gpus_cuda_visible_devices_leaves_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"  # an nvidia-smi that lists two GPUs, on a machine with none
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\nprintf '0, GPU-0a1b2c3d\\n1, GPU-4e5f6a7b\\n'\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", "4", "4",
               "0"]
    workload = CommandWorkload(command=command, source=Source(path=str(source)),
                               env={**_env(), "CUDA_VISIBLE_DEVICES": "GPU-4e5f"}, outputs=OutputSpec(collect=[]),
                               resources=Requirements(gpus=1))
    run = flash.submit(workload, output_dir=tmp_path / "one-gpu", watch=False, quiet=True, ranks=(1, 2))
    assert run.state is LaunchState.SUCCEEDED, (run.events, run.logs(100))
    assert [attempt["world_size"] for attempt in run.attempts] == [1]
    changes = [event["message"] for event in run.events if event["type"] == "WORLD_SIZE_CHANGED"]
    assert changes == [("task-000 starts with 1 rank instead of 2 (the run's max): CUDA_VISIBLE_DEVICES='GPU-4e5f' "
                       "makes 1 of the 2 GPUs nvidia-smi lists visible")]


@pytest.mark.parametrize(("ranks", "words"), [
    ("1:2:3", "ranks '1:2:3' is not MIN:MAX"), ("a:b", "is not MIN:MAX"), ((2, 1), "1 <= min <= max"),
    ((0, 2), "1 <= min <= max"), ([1, 2, 3], "must be (min, max)"),
])
def test_ranks_that_cannot_be_a_range_are_refused(tmp_path: Path, ranks: object, words: str) -> None:
    workload = CommandWorkload(command="python train.py", source=Source(path=str(tmp_path)))
    with pytest.raises(InvalidSubmission, match=re.escape(words)):
        flash.submit(workload, output_dir=tmp_path / "run", watch=False, quiet=True, ranks=ranks)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_a_command_that_cannot_be_resized_and_lose_rank_without_ranks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSubmission, match="must be a torchrun or a plain python command"):
        flash.submit(CommandWorkload(command="bash train.sh", source=Source(path=str(tmp_path))),
                     output_dir=tmp_path / "a", watch=False, quiet=True, ranks=(1, 2))
    chaos = ChaosPlan(faults=[Fault(kind="lose_rank", rank=1, at_step=3)])
    with pytest.raises(InvalidSubmission, match="only an elastic run can continue without"):
        flash.submit(CommandWorkload(command="python train.py", source=Source(path=str(tmp_path))),
                     output_dir=tmp_path / "b", watch=False, quiet=True, chaos=chaos)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_torchrun_options_an_elastic_local_run_cannot_keep_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for name, option, words in [("nodes", "--nnodes=2", "torchrun's --nnodes 2 spreads the job over several"),
                                ("restarts", "--max-restarts=3", "torchrun's --max-restarts 3 would restart them")]:
        workload = CommandWorkload(command=f"torchrun {option} --nproc-per-node 2 train.py",
                                   source=Source(path=str(tmp_path)))
        with pytest.raises(InvalidSubmission, match=re.escape(words)):
            run = flash.submit(workload, output_dir=tmp_path / name, watch=False, quiet=True, ranks=(1, 2),
                               wait=False)
            run.cancel()  # reached only when it was not refused: a second node would be waited for forever
        assert not (tmp_path / name).exists()
