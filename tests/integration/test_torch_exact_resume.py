"""A flashruntime.torch script with dropout and a shuffled loader, killed mid-run and resumed
from its checkpoint, ends bit-for-bit where the same script ends without the kill: the
checkpoint carries every rank's random generators and the loader's position, captured at the
save call also when the step is written in the background (``async_save=True``)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import torch
    import flashruntime.torch as ft
    from torch.utils.data import DataLoader, TensorDataset

    total, kill_at, async_save = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "async"
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = ft.prepare(model, optimizer, loader)
    batches = iter(loader)
    first_attempt = not os.environ.get("FLASHML_ATTEMPT_ID", "").endswith("-r1")
    seen = []
    for step in range(ft.start_step(), total):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        ft.checkpoint(model, optimizer, step=step + 1, every=10, async_save=async_save)
        if first_attempt and step + 1 == kill_at:
            if async_save:  # step 20 committed before the kill, so the resume step is known
                ft.wait_for_checkpoint()
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()
            if ft.rank() == ft.world_size() - 1:
                os.kill(os.getpid(), signal.SIGKILL)
    if ft.is_main():
        weights = [round(float(p.detach().sum()), 10) for p in model.parameters()]
        json.dump({"final_loss": loss.item(), "weights": weights},
                  open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _run(tmp_path: Path, name: str, ranks: int, kill_at: int, mode: str = "sync") -> flash.Run:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    launcher = [sys.executable] if ranks == 1 else [*_torchrun(), f"--nproc-per-node={ranks}", "--standalone",
                                                    "--local-addr=127.0.0.1"]
    workload = CommandWorkload(command=[*launcher, "train.py", "40", str(kill_at), mode], source=Source(path=str(source)),
                               env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                               outputs=OutputSpec(collect=[]))
    return flash.submit(workload, output_dir=tmp_path / name, watch=False, quiet=True, max_restarts=1)


@pytest.mark.parametrize(("ranks", "mode"), [(1, "sync"), (2, "sync"), (2, "async")])
def test_a_killed_and_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path: Path, ranks: int,
                                                                               mode: str) -> None:
    pytest.importorskip("torch")
    straight = _run(tmp_path, "straight", ranks, kill_at=0)  # saved synchronously: the same numbers either way
    resumed = _run(tmp_path, "resumed", ranks, kill_at=25, mode=mode)
    assert straight.state is LaunchState.SUCCEEDED, straight.logs(60)
    assert resumed.state is LaunchState.SUCCEEDED, resumed.logs(60)
    assert len(straight.attempts) == 1 and len(resumed.attempts) == 2
    assert [e["message"] for e in resumed.events if e["type"] == "RESUME_SELECTED"][0].startswith(
        "task-000-r1 resumes from step 20")
    ours, theirs = resumed.trials[0], straight.trials[0]
    assert ours["final_loss"] == pytest.approx(theirs["final_loss"], abs=1e-6)
    assert ours["weights"] == pytest.approx(theirs["weights"], abs=1e-6)


def test_the_loader_continues_after_the_batches_it_had_handed_out(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from flashruntime.torch._loader import ResumableLoader

    data = torch.utils.data.TensorDataset(torch.arange(20))
    loader = ResumableLoader(torch.utils.data.DataLoader(data, batch_size=3, shuffle=True), 1, 0)
    first_epoch = [batch[0].tolist() for batch in loader]
    again = ResumableLoader(torch.utils.data.DataLoader(data, batch_size=3, shuffle=True), 1, 0)
    it = iter(again)
    head = [next(it)[0].tolist() for _ in range(2)]
    state = again.state_dict()
    assert state == {"epoch": 0, "samples": 6, "end": 20, "offset": 0, "position": 2, "world_size": 1,
                     "batch_size": 3, "global_batch": 3}
    resumed = ResumableLoader(torch.utils.data.DataLoader(data, batch_size=3, shuffle=True), 1, 0)
    resumed.load_state_dict(state)
    tail = [batch[0].tolist() for batch in resumed]
    assert head + tail == first_epoch
    assert sorted(sum(first_epoch, [])) == list(range(20))
    second = [batch[0].tolist() for batch in resumed]
    assert second != first_epoch and sorted(sum(second, [])) == list(range(20))  # a new epoch, a new order
