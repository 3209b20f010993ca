"""A multi-node job (``parameters.nodes = {min: 1, max: 2}``) on a real coordinator: ``flashruntime
serve --rendezvous-port`` hosting the c10d store, and two real ``flashruntime worker`` processes,
each running one node of a 2-rank ``flashruntime.torch`` DDP script under real torchrun and gloo.

The machine of global rank 0 (the one writing checkpoints and metrics) is lost for good
mid-run: its agent and every process under it are killed with SIGKILL. With no manual step the
node left meets the rendezvous again alone after torchrun's timeouts, resumes at one rank from
the newest checkpoint in the shared checkpoint directory, sees every sample of the epoch
exactly once across the change, and finishes the run; the job SUCCEEDS, the lost node's task is
cancelled as not needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._support import REPO_ROOT, wait_until
from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = [pytest.mark.service, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="kill -9 of a process tree")]
pytest.importorskip("torch")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

SAMPLES, PER_RANK_BATCH, TOTAL, CHECKPOINT_EVERY = 64, 4, 48, 4  # 2 ranks: 8 steps an epoch
KILL_AFTER_STEP = 12
HANG_GUARD_S = 420.0

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft
    from torch.utils.data import DataLoader, TensorDataset

    total, pace, progress = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    n = %(samples)d
    data = TensorDataset(torch.arange(n), torch.randn(n, 8), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=%(batch)d, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = ft.prepare(model, optimizer, loader)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    name = f"{os.environ['FLASHML_TASK_ID']}-restart{restart}-rank{ft.rank()}.jsonl"
    seen = open(os.path.join(progress, name), "a")
    step = ft.start_step()
    print(f"rank {ft.rank()} of {ft.world_size()} starts at step {step}", flush=True)
    while step < total:
        for ids, x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            seen.write(json.dumps({"step": step, "epoch": loader.epoch, "ids": ids.tolist(), "rank": ft.rank(),
                                   "world_size": ft.world_size(), "restart": int(restart),
                                   "task": os.environ["FLASHML_TASK_ID"], "start": ft.start_step(),
                                   "t": time.time()}) + "\\n")
            seen.flush()
            ft.log_metrics({"step": step, "loss": loss.item(), "world_size": ft.world_size()})
            ft.checkpoint(model, optimizer, step=step, every=%(every)d)
            if step >= total:
                break
            time.sleep(pace)
    if ft.is_main():
        json.dump({"final_loss": loss.item(), "step": step, "world_size": ft.world_size()},
                  open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""") % {"samples": SAMPLES, "batch": PER_RANK_BATCH, "every": CHECKPOINT_EVERY}


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it, by parent pid (torchrun's ranks leave its session,
    not its family)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, []))
    return found


def _lose_machine(worker: subprocess.Popen[str]) -> list[int]:
    """What losing the agent's machine does: every process of it gone at once, nothing told."""
    pids = _descendants(worker.pid)
    for pid in pids:  # frozen first, so none of them can notice the others going
        with_process(pid, signal.SIGSTOP)
    for pid in pids:
        with_process(pid, signal.SIGKILL)
    worker.wait(timeout=30)
    return pids


def with_process(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _steps(progress: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(progress.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _job_spec(script: Path, progress: Path, ckpt: Path) -> dict[str, Any]:
    return {"metadata": {"name": "two-nodes"}, "spec": {
        "workload": {"type": "command", "parameters": {
            "command": [sys.executable, str(script), str(TOTAL), "0.3", str(progress)],
            "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
            "nodes": {"min": 1, "max": 2}, "nproc_per_node": 1, "checkpoint_dir": str(ckpt),
            "lease_seconds": 5}},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "gang-team"}}}


def test_a_two_node_job_loses_the_rank0_machine_and_finishes_on_the_node_left(tmp_path: Path) -> None:
    script, progress, ckpt = tmp_path / "train.py", tmp_path / "progress", tmp_path / "shared-ckpt"
    script.write_text(SCRIPT)
    progress.mkdir()
    port, store_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"),
         "--rendezvous-port", str(store_port), "--log-level", "warning"],
        env=process_env(FLASHML_SWEEP_INTERVAL_S="0.5"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers: dict[str, subprocess.Popen[str]] = {}
    try:
        wait_healthy(url, timeout_s=120, process=serve)
        # Two machines in one: each agent known by a loopback address of its own, as two hosts
        # are by theirs (all of 127.0.0.0/8 reaches this machine).
        for node, address in (("box-a", "127.0.0.1"), ("box-b", "127.0.0.2")):
            workers[node] = subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir",
                 str(tmp_path / node), "--node-id", node, "--runner", "trusted", "--pools", "gang-team",
                 "--poll-seconds", "0.2", "--node-addr", address],
                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        created = httpx.post(f"{url}/v1alpha1/jobs", json=_job_spec(script, progress, ckpt), timeout=30)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]

        def at_two_ranks() -> dict[str, Any] | None:
            return next((row for row in _steps(progress)
                         if row["world_size"] == 2 and row["rank"] == 0 and row["step"] >= KILL_AFTER_STEP), None)

        wait_until(lambda: at_two_ranks() is not None, "both nodes to train together", timeout=HANG_GUARD_S)
        rank0_task = at_two_ranks()["task"]  # type: ignore[index]
        tasks = {t["task_id"]: t for t in httpx.get(f"{url}/v1alpha1/jobs/{job_id}/tasks", timeout=30).json()}
        assert sorted(tasks) == ["node-000", "node-001"]
        assert {t["state"] for t in tasks.values()} == {"LEASED"}, tasks
        lost = tasks[rank0_task]["node_id"]
        assert {t["node_id"] for t in tasks.values()} == {"box-a", "box-b"}  # one node per machine
        killed_at, killed_wall = time.monotonic(), time.time()
        steps_before = max(row["step"] for row in _steps(progress))
        _lose_machine(workers.pop(lost))

        def finished() -> bool:
            return httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=30).json()["state"] != "RUNNING"

        wait_until(finished, "the job to finish on the node left", timeout=HANG_GUARD_S)
        recovered_s = time.monotonic() - killed_at
        job = httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=30).json()
        tasks = {t["task_id"]: t for t in httpx.get(f"{url}/v1alpha1/jobs/{job_id}/tasks", timeout=30).json()}
        events = httpx.get(f"{url}/v1alpha1/jobs/{job_id}/events", timeout=30).json()
    finally:
        outputs = {node: stop_process(worker) for node, worker in workers.items()}
        serve_log = stop_process(serve)
    assert job["state"] == "SUCCEEDED", (job, tasks, outputs, serve_log[-3000:])
    survivor_task = next(task_id for task_id in tasks if task_id != rank0_task)
    assert tasks[survivor_task]["state"] == "COMPLETED" and tasks[survivor_task]["node_id"] != lost
    assert tasks[rank0_task]["state"] == "CANCELLED", tasks
    assert any(e["type"] == "LEASE_EXPIRED" and e["data"].get("task_id") == rank0_task for e in events)
    assert any(e["type"] == "TASK_CANCELLED" and e["data"].get("task_id") == rank0_task
               and "not needed" in e["data"].get("reason", "") for e in events)

    rows = _steps(progress)
    after = [row for row in rows if row["task"] == survivor_task and row["world_size"] == 1]
    assert after, f"the node left never trained alone (recovered in {recovered_s:.0f} s)"
    resumed_from = after[0]["start"]
    # From the newest checkpoint the lost rank 0 wrote (every 4 steps), never from the start.
    assert steps_before - CHECKPOINT_EVERY <= resumed_from <= steps_before and resumed_from > 0, (resumed_from,
                                                                                                 steps_before)
    assert max(row["step"] for row in after) == TOTAL
    first_alone = min(row["t"] for row in after)
    print(f"lost at step {steps_before}; resumed alone from step {resumed_from}; first step alone "
          f"{first_alone - killed_wall:.1f} s after the loss; job ended {recovered_s:.1f} s after it")
    # The steps that count are each step's last run: a run of the group is its ranks of one
    # world size started from one step; the steps redone after the loss replace the lost run's.
    # Every epoch then holds each sample exactly once.
    runs: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        runs.setdefault((row["restart"], row["world_size"], row["start"]), []).append(row)
    final: dict[int, list[dict[str, Any]]] = {}
    for run in sorted(runs.values(), key=lambda run_rows: min(row["t"] for row in run_rows)):
        for step in {row["step"] for row in run}:
            final[step] = [row for row in run if row["step"] == step]
    assert sorted(final) == list(range(1, TOTAL + 1))
    assert all(len(step_rows) == step_rows[0]["world_size"] for step_rows in final.values())
    by_epoch: dict[int, Counter[int]] = {}
    for step_rows in final.values():
        for row in step_rows:
            by_epoch.setdefault(row["epoch"], Counter()).update(row["ids"])
    for epoch, seen in by_epoch.items():
        assert seen == Counter(range(SAMPLES)), f"epoch {epoch}: {sorted(seen.items())[:8]}..."
    metrics = tmp_path / "data" / "artifacts" / "jobs" / job_id / survivor_task / "metrics.json"
    assert json.loads(metrics.read_text())["step"] == TOTAL
