"""The torch helper on CUDA (nccl): per-rank device placement and kill-and-resume of
``examples/ddp_train.py`` under torchrun with ``nproc_per_node = min(2, device_count)``.
Skips cleanly without CUDA. With one GPU the run is a single process (``backend()`` is
None by design), so multi-GPU placement is exercised only where two GPUs are visible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration._torchrun import final_metrics as _final
from tests.integration._torchrun import logged_steps as _steps
from tests.integration._torchrun import single_node as _single_node

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture
def gpus() -> int:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        pytest.skip("no CUDA device visible")
    return min(2, torch.cuda.device_count())


def test_ranks_are_placed_on_their_own_gpu_and_resume_after_a_kill(gpus: int, tmp_path: Path) -> None:
    from flashruntime.checkpoint.local import latest_valid_manifest

    args = ("--steps", "12", "--checkpoint-every", "4")
    whole = _single_node(tmp_path / "whole", tmp_path / "ckpt-whole", *args, nproc=gpus)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected_backend = "nccl" if gpus > 1 else None
    for rank in range(gpus):
        beat = json.loads((tmp_path / "whole" / "ranks" / f"rank-{rank}.json").read_text())
        assert (beat["device"], beat["backend"], beat["world_size"]) == (f"cuda:{rank}", expected_backend, gpus)
    summary = _final(tmp_path / "whole")
    assert (summary["device"], summary["backend"]) == ("cuda:0", expected_backend)

    ckpt = tmp_path / "ckpt"
    crashed = _single_node(tmp_path / "crashed", ckpt, *args, "--crash-at-step", "6", nproc=gpus)
    assert crashed.returncode != 0
    assert latest_valid_manifest(ckpt).step == 4  # type: ignore[union-attr]
    resumed = _single_node(tmp_path / "resumed", ckpt, *args, "--crash-at-step", "6", nproc=gpus)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _final(tmp_path / "resumed")["start_step"] == 4
    assert _steps(tmp_path / "resumed") == list(range(5, 13))
    assert abs(_final(tmp_path / "resumed")["final_loss"] - summary["final_loss"]) <= 1e-6


# A CUDA job that keeps the GPU busy for a few sampler ticks and reports its device.
_CUDA_BUSY = """
import json, os, time
import torch
a = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(os.environ.get("BUSY_SECONDS", "6"))
while time.time() < end:
    a = torch.tanh(a @ a)
torch.cuda.synchronize()
json.dump({"device": torch.cuda.get_device_name(0), "finite": bool(torch.isfinite(a).all())},
          open("metrics.json", "w"))
"""


def test_submit_of_a_cuda_job_collects_metrics_and_gpu_telemetry(gpus: int, tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    import sys

    import flashruntime as flash
    from flashruntime.launchers import LaunchState
    from flashruntime.monitor import evidence_from_telemetry

    script = tmp_path / "src" / "busy.py"
    script.parent.mkdir()
    script.write_text(_CUDA_BUSY)
    run = flash.submit(flash.CommandWorkload(command=[sys.executable, str(script)],
                                             source=flash.Source(path=str(script.parent))),
                       output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED, run.events
    assert run.trials[0]["finite"] is True and run.trials[0]["device"]
    telemetry = tmp_path / "out" / "local" / "task-000" / "telemetry.jsonl"
    ticks = [json.loads(line) for line in telemetry.read_text().splitlines() if line.strip()]
    rows = [row for tick in ticks for row in tick["machine"]["gpus"]]
    assert rows, "nvidia-smi gave no GPU rows while a CUDA job ran"
    assert max(row["util_percent"] or 0 for row in rows) > 0
    evidence = evidence_from_telemetry(telemetry)
    assert evidence.gpu_util_percent_mean is not None and evidence.gpu_util_percent_mean > 0

    from flashruntime.viewer import collect  # the run page's GPU KPI reads the newest tick

    state = collect(tmp_path / "out")
    assert state["state"] == "SUCCEEDED" and state["monitor"]["machine"]["gpus"]
    assert state["monitor"]["machine"]["gpus"][0]["name"] == rows[0]["name"]


def test_worker_registration_reports_every_visible_gpu(gpus: int) -> None:
    """The agent's registration lists the GPUs nvidia-smi sees, so the
    coordinator's GPU gate can place ``gpus`` tasks on this machine."""
    import torch

    from flashruntime.agent.worker import WorkerAgent

    capabilities = WorkerAgent("http://127.0.0.1:9", node_id="gpu-box").registration().capabilities
    assert len(capabilities.gpus) == torch.cuda.device_count()
    assert [gpu.index for gpu in capabilities.gpus] == list(range(torch.cuda.device_count()))
    assert capabilities.gpus[0].name == torch.cuda.get_device_name(0)
    assert capabilities.gpus[0].memory_total_mb and capabilities.gpus[0].memory_total_mb > 1024
