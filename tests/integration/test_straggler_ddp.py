"""Two gloo DDP ranks through ``flash.submit``: rank 1 doing twice its peer's work before the
gradient all-reduce is reported as a straggler (event and run.json) within 20 steps; the same
job with both ranks at one pace reports none. The ranks end their steps together either way:
only their compute times, which ``ft.prepare`` measures, tell them apart."""

from __future__ import annotations

import io
import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STEPS = 20

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    import flashruntime.torch as ft

    slowdown, steps = float(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = ft.prepare(model, optimizer)
    for step in range(1, steps + 1):
        # The step's own work (a data pipeline, a forward pass): a sleep, so a busy host cannot
        # change the two ranks' ratio; rank 1 takes `slowdown` times as long.
        time.sleep(0.05 * (slowdown if ft.rank() == 1 else 1.0))
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # the all-reduce: rank 0 waits here for rank 1
        optimizer.step()
        ft.log_metrics({"step": step, "loss": loss.item()})
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
""")


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _run(tmp_path: Path, name: str, slowdown: float, stream: io.StringIO | None = None) -> flash.Run:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    command = [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py",
               str(slowdown), str(STEPS)]
    workload = CommandWorkload(command=command, source=Source(path=str(source)),
                               env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                               outputs=OutputSpec(collect=[]))
    return flash.submit(workload, output_dir=tmp_path / name, watch=False, quiet=stream is None, stream=stream)


def _stragglers(run: flash.Run) -> tuple[list[dict], list[dict]]:
    doc = json.loads((run.output_dir / "run.json").read_text())
    events = [e for e in doc["events"] if e["type"] == "STRAGGLER_DETECTED"]
    return events, [entry for attempt in doc["attempts"] for entry in attempt.get("stragglers") or []]


def test_a_rank_twice_as_slow_is_reported_as_a_straggler_within_20_steps(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    terminal = io.StringIO()
    run = _run(tmp_path, "slowed", slowdown=2.0, stream=terminal)
    assert run.state is LaunchState.SUCCEEDED, run.logs(60)
    events, episodes = _stragglers(run)
    assert len(events) == 1, events  # once for the episode, not once per step
    assert f"flashruntime: {events[0]['message']}" in terminal.getvalue().splitlines()  # also said as it runs
    assert events[0]["message"].startswith(f"task-000: rank 1 on {socket.gethostname()} is a straggler: it computes ")
    [episode] = episodes
    assert (episode["rank"], episode["host"]) == (1, socket.gethostname())
    assert episode["ratio"] >= 1.5 and episode["ended_step"] is None


def test_ranks_at_one_pace_report_no_straggler(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = _run(tmp_path, "even", slowdown=1.0)
    assert run.state is LaunchState.SUCCEEDED, run.logs(60)
    assert _stragglers(run) == ([], [])
    ranks = sorted((Path(run.attempts[0]["output_dir"]) / "ranks").glob("rank-*.json"))
    measured = [json.loads(path.read_text())["compute_s"] for path in ranks]
    assert len(measured) == 2 and all(len(times) >= 10 for times in measured)  # measured, and judged even
