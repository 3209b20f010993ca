"""The CUDA paths of hang detection and asynchronous checkpoints, on a real device: a job
that stops making progress after its CUDA work is caught, its stack dumped and its attempt
relaunched; an asynchronous save of a model in GPU memory holds the values of the moment
it was asked for, even when the training thread changes the parameters on the device before
the background write is done. Skips cleanly without CUDA."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture
def cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")


def _submit(script: str, tmp_path: Path, **options: object) -> flash.Run:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "job.py").write_text(textwrap.dedent(script))
    workload = CommandWorkload(command=[sys.executable, "job.py"], source=Source(path=str(source)),
                               env={"PYTHONPATH": str(REPO_ROOT)}, outputs=OutputSpec(collect=[]))
    return flash.submit(workload, output_dir=tmp_path / "out", watch=False, quiet=True, **options)  # type: ignore[arg-type]


# Steps on the GPU; the first attempt then waits on the host forever, its CUDA context open.
HANGS_AFTER_CUDA_WORK = """
    import os, time
    import torch
    import flashruntime.torch as ft

    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = ft.prepare(model, optimizer)
    first = "-r" not in os.environ["FLASHML_ATTEMPT_ID"]
    for step in range(ft.start_step(), 8):
        x = torch.randn(64, 256, device="cuda")
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        ft.checkpoint(model, optimizer, step=step + 1, every=2)
        if first and step + 1 == 4:
            def waits_on_the_host_forever():
                while True:
                    time.sleep(1)
            waits_on_the_host_forever()
    import json
    json.dump({"loss": loss.item()}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


def test_a_cuda_job_that_stops_advancing_is_dumped_and_relaunched(cuda: None, tmp_path: Path) -> None:
    run = _submit(HANGS_AFTER_CUDA_WORK, tmp_path, max_restarts=1, hang_timeout_s=8)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    (detected,) = [e["message"] for e in doc["events"] if e["type"] == "HANG_DETECTED"]
    assert "step 4" in detected, detected
    stacks = next((tmp_path / "out").rglob("hang-stacks.txt")).read_text()
    assert "waits_on_the_host_forever" in stacks, stacks
    resumed = [e["message"] for e in doc["events"] if e["type"] == "RESUME_SELECTED"]
    assert resumed and "from step 4 " in resumed[-1], resumed


# An async save of GPU-resident state, then, at once, an in-place change of every parameter
# on the device: the checkpoint must hold the values from before the change.
ASYNC_FROM_GPU = """
    import json, os
    import torch
    import flashruntime.torch as ft

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = ft.prepare(model, optimizer)
    loss = model(torch.randn(32, 1024, device="cuda")).square().mean()
    loss.backward()
    optimizer.step()
    expected = {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(100.0)  # queued on the device's stream behind the staging copy
    assert ft.wait_for_checkpoint(timeout=120)
    step_dir = os.path.join(os.environ["FLASHML_CKPT_DIR"], "step-000001")
    saved = torch.load(os.path.join(step_dir, "model.pt"), map_location="cpu")
    same = all(torch.equal(saved[name], value) for name, value in expected.items())
    changed = all(not torch.equal(saved[name], value.detach().cpu()) for name, value in model.state_dict().items())
    json.dump({"same": same, "changed_after": changed, "device": str(next(model.parameters()).device)},
              open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


def test_an_async_save_of_gpu_state_holds_the_values_it_was_asked_for(cuda: None, tmp_path: Path) -> None:
    run = _submit(ASYNC_FROM_GPU, tmp_path, max_restarts=0)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    result = json.loads(next((tmp_path / "out").rglob("metrics.json")).read_text())
    assert result == {"same": True, "changed_after": True, "device": "cuda:0"}, result
    from flashruntime.checkpoint.local import latest_valid_manifest

    manifest = latest_valid_manifest(tmp_path / "out" / "local" / "ckpt")
    assert manifest is not None and manifest.step == 1
    assert os.path.getsize(tmp_path / "out" / "local" / "ckpt" / "step-000001" / "model.pt") > 8 << 20
