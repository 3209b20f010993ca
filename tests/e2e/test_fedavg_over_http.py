"""The FedAvg convergence run over real HTTP: a real ``flashruntime serve``, two real
``flashruntime worker`` processes running ``fedavg_worker`` tasks, and ``run_fedavg``
through ``HttpCoordinator``. Three rounds over four shards must reach
a union loss within 10 % of centralized training on the union, as the in-process run
of ``tests/integration/test_fedavg_convergence.py`` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = [pytest.mark.service, pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from flashml_workloads import fedavg_worker as fw  # noqa: E402
from flashml_workloads.fedavg_driver import HttpCoordinator, run_fedavg  # noqa: E402

WORKER_PARAMS = {"local_steps": 25, "lr": 0.2, "batch_size": 16, "seed": 7, "in_dim": 8, "hidden": 16, "out_dim": 2,
                 "dataset_size": 512}
ROUNDS, SHARDS = 3, 4
FULL = {**WORKER_PARAMS, "round": 0, "shard": 0, "num_shards": SHARDS}


def test_three_rounds_over_a_real_coordinator_and_workers_match_centralized(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = process_env(OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "flashruntime.cli"]
    server = subprocess.Popen([*cli, "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers: list[subprocess.Popen[str]] = []
    try:
        wait_healthy(url, process=server)
        for name in ("volunteer-1", "volunteer-2"):
            workers.append(subprocess.Popen(
                [*cli, "--api", url, "worker", "--node-id", name, "--work-dir", str(tmp_path / name),
                 "--poll-seconds", "0.2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        initial = fw.state_to_blob(fw.build_model(FULL))
        out = run_fedavg(HttpCoordinator(url), rounds=ROUNDS, num_shards=SHARDS, min_participants=SHARDS,
                         worker_params=WORKER_PARAMS, initial_weights=initial, poll_seconds=0.2,
                         round_timeout_s=240.0)
        assert [h["participants"] for h in out["history"]] == [SHARDS] * ROUNDS
        assert all(h["clipped"] == [] for h in out["history"])
        losses = [h["mean_loss"] for h in out["history"]]
        assert losses[0] > losses[1] > losses[2]
        federated = fw.union_loss(FULL, out["weights"])
        centralized = fw.centralized_loss(FULL, ROUNDS)
        assert federated < 0.5 * fw.union_loss(FULL)
        assert federated <= 1.10 * centralized, (federated, centralized)
        # both volunteers did work, and every commit was verified by the coordinator
        import httpx

        nodes = {n["node_id"]: n["accepted_tasks"] for n in httpx.get(f"{url}/v1alpha1/nodes").json()}
        assert set(nodes) == {"volunteer-1", "volunteer-2"} and sum(nodes.values()) == ROUNDS * SHARDS
        assert all(count > 0 for count in nodes.values()), nodes
    finally:
        logs = [stop_process(worker) for worker in workers]
        server_log = stop_process(server)
    assert all(worker.returncode == 0 for worker in workers), logs
    assert server.returncode == 0, server_log
