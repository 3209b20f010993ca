"""``checkpoint(..., async_save=True)`` in real processes: a ``kill -9`` while the background
thread writes leaves the previous checkpoint the one selected, a normal exit finishes the save
in flight, and two gloo ranks under torchrun save asynchronously with rank 0 writing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashruntime.checkpoint.local import MANIFEST_NAME, clear_verification_cache, latest_valid_manifest
from tests.integration._torchrun import _env, torchrun_argv

pytestmark = [pytest.mark.torch, pytest.mark.slow]

# Step 2's optimizer state holds a value whose pickling announces itself and then never ends:
# the background write is held inside optimizer.pt, after model.pt, before the manifest.
STALLED = textwrap.dedent("""
    import os, sys, time
    import torch
    import flashruntime.torch as ft

    marker = sys.argv[1]

    class Stall:
        def __reduce__(self):
            open(marker, "w").close()
            time.sleep(3600)

    class WithStall:
        def __init__(self, optimizer):
            self.optimizer = optimizer
        def state_dict(self):
            return {**self.optimizer.state_dict(), "stall": Stall()}

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = ft.prepare(model, optimizer)
    for step in (1, 2):
        model(torch.randn(8, 256)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ft.checkpoint(model, optimizer if step == 1 else WithStall(optimizer), step=step, async_save=True)
        if step == 1:
            ft.wait_for_checkpoint()
        print(f"returned {step}", flush=True)  # the training thread goes on while step 2 is written
    while True:
        model(torch.randn(8, 256)).square().mean().backward()  # training goes on
        time.sleep(0.01)
""")

EXITS = textwrap.dedent("""
    import time
    import torch
    import flashruntime.torch as ft

    class Slow:
        def __reduce__(self):  # the write is still going when the script ends
            time.sleep(1.0)
            return (int, (7,))

    class WithSlow:
        def __init__(self, optimizer):
            self.optimizer = optimizer
        def state_dict(self):
            return {**self.optimizer.state_dict(), "slow": Slow()}

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = ft.prepare(model, optimizer)
    ft.checkpoint(model, WithSlow(optimizer), step=5, async_save=True)
    print("end of script", flush=True)
""")

TWO_RANKS = """\
import json, os
import torch
import torch.distributed as dist
import flashruntime.torch as ft

torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = ft.prepare(model, optimizer)
for step in range(1, 13):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ft.checkpoint(model, optimizer, step=step, every=4, async_save=True)
ft.wait_for_checkpoint()
weights = {key: value.tolist() for key, value in model.module.state_dict().items()}
with open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], f"weights-{ft.rank()}.json"), "w") as handle:
    json.dump(weights, handle)
dist.barrier()
dist.destroy_process_group()
"""


def test_kill9_during_the_background_write_leaves_the_previous_checkpoint_selected(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    marker = tmp_path / "writing"
    process = subprocess.Popen([sys.executable, "-c", STALLED, str(marker)], env=_env(out, ckpt),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline().strip() for _ in range(2)]
        assert lines == ["returned 1", "returned 2"], process.stderr.read() if process.stderr else ""
        deadline = time.monotonic() + 120  # hang guard only
        while not marker.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the background write of step 2 never began its optimizer part"
            time.sleep(0.02)
        # Step 2 is mid-write now: model.pt committed, optimizer.pt being written, no manifest.
        partial = ckpt / "step-000002"
        assert (partial / "model.pt").is_file() and (partial / ".optimizer.pt.tmp").is_file()
        assert process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (partial / MANIFEST_NAME).exists()
    clear_verification_cache()  # select as the restarted process will: hash what it picks
    chosen = latest_valid_manifest(ckpt)
    assert chosen is not None and chosen.step == 1
    assert latest_valid_manifest(ckpt, pattern="step-000002") is None


def test_a_normal_exit_finishes_the_save_in_flight(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    done = subprocess.run([sys.executable, "-c", EXITS], env=_env(out, ckpt), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "end of script"
    clear_verification_cache()
    chosen = latest_valid_manifest(ckpt)
    assert chosen is not None and chosen.step == 5
    assert sorted(part.key for part in chosen.parts) == ["model.pt", "optimizer.pt", "resume.pt"]


def test_two_gloo_ranks_save_asynchronously_and_rank_zero_writes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TWO_RANKS)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    argv = [*torchrun_argv(), "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
            str(script)]
    done = subprocess.run(argv, env=_env(out, ckpt), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000004", "step-000008", "step-000012"]
    clear_verification_cache()
    for step in (4, 8, 12):
        manifest = latest_valid_manifest(ckpt, pattern=f"step-{step:06d}")
        assert manifest is not None and manifest.world_size == 2
    resume = torch.load(ckpt / "step-000012" / "resume.pt", weights_only=True)
    assert sorted(entry["rank"] for entry in resume["ranks"]) == [0, 1]  # both ranks' generators, gathered
    final = json.loads((out / "weights-0.json").read_text())
    assert final == json.loads((out / "weights-1.json").read_text())  # DDP kept the replicas equal
    saved = torch.load(ckpt / "step-000012" / "model.pt")
    assert {key: value.tolist() for key, value in saved.items()} == final  # the state at the last save


# From GPU memory: pinned host buffers, copies that do not block the call (the stream is still
# busy behind a long sleep kernel when it returns), and a background write that waits for them.
ON_GPU = """\
import json, os
import torch
import flashruntime.torch as ft
from flashruntime.torch._async_save import HostStager

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = ft.prepare(model, optimizer)
assert ft.device() == "cuda:0", ft.device()

def train():
    model(torch.randn(64, 2048, device="cuda")).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()

train()
ft.checkpoint(model, optimizer, step=1, async_save=True)  # the first save allocates the pinned copy
ft.wait_for_checkpoint()
train()
expected = {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}
momentum = optimizer.state[model[0].weight]["momentum_buffer"].cpu().clone()
stream = torch.cuda.current_stream()
torch.cuda._sleep(int(4e9))  # seconds of GPU time queued ahead of the copies
ft.checkpoint(model, optimizer, step=2, async_save=True)
busy = not stream.query()
with torch.no_grad():  # queued after the copies on the same stream: they still read the old values
    for parameter in model.parameters():
        parameter.mul_(0.0)
ft.wait_for_checkpoint()
saved = torch.load(os.path.join(os.environ["FLASHML_CKPT_DIR"], "step-000002", "model.pt"))
saved_optimizer = torch.load(os.path.join(os.environ["FLASHML_CKPT_DIR"], "step-000002", "optimizer.pt"))

stager = HostStager()
source = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
staged, events = stager.stage({"t": source})
source.add_(1.0)
for event in events:
    event.synchronize()
print(json.dumps({
    "busy": busy,
    "same": all(torch.equal(saved[key], expected[key]) for key in expected),
    "cpu": all(value.device.type == "cpu" for value in saved.values()),
    "momentum": torch.equal(saved_optimizer["state"][0]["momentum_buffer"].cpu(), momentum),
    "zeroed": all(float(p.abs().sum()) == 0.0 for p in model.parameters()),
    "pinned": staged["t"].is_pinned(), "events": len(events),
    "staged_first": torch.equal(staged["t"], torch.arange(1 << 20, dtype=torch.float32)),
}))
"""


@pytest.mark.gpu
def test_staging_from_gpu_memory_is_pinned_and_ordered_before_later_kernels(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = {**_env(out, ckpt), "CUDA_VISIBLE_DEVICES": "0"}
    done = subprocess.run([sys.executable, "-c", ON_GPU], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"busy": True, "same": True, "cpu": True, "momentum": True, "zeroed": True, "pinned": True,
                      "events": 1, "staged_first": True}
    clear_verification_cache()
    assert latest_valid_manifest(ckpt).step == 2  # type: ignore[union-attr]
