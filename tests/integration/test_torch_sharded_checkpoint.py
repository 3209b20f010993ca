"""FSDP2 (``fully_shard``) on 2 CPU ranks (gloo, real torchrun) checkpointed by
``ft.checkpoint`` through PyTorch DCP under flashruntime's manifest, in the background
(``async_save``): the step resumes at 2 ranks exactly where an uninterrupted run goes, and
at 1 rank (DCP reshards it) exactly where a run that loads the same step by hand goes."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.integration._torchrun import _env, torchrun_argv

pytestmark = [pytest.mark.torch, pytest.mark.slow]
torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

TOTAL, STOP_AT = 12, 6

MODEL = """
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)

def train(model, optimizer, start, total, after_step):
    # One global batch of 16 per step, split evenly across the ranks: the mean loss, and the
    # averaged gradient, are the global batch's at any world size.
    world, rank = dist.get_world_size(), dist.get_rank()
    out = os.environ["FLASHML_OUTPUT_DIR"]
    for step in range(start, total):
        generator = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(16, 8, generator=generator)
        y = x.sum(1, keepdim=True)
        share = 16 // world
        loss = torch.nn.functional.mse_loss(model(x[rank * share:(rank + 1) * share]),
                                            y[rank * share:(rank + 1) * share])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            with open(os.path.join(out, "losses.jsonl"), "a") as lines:
                lines.write(json.dumps({"step": step + 1, "loss": mean.item() / world}) + "\\n")
        if after_step(step + 1):
            break
"""

# flashruntime.torch: restore whatever the checkpoint directory holds, save every STOP_AT steps.
WITH_FT = MODEL + """
import flashruntime.torch as ft
total, stop_at = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
model, optimizer = build()
model, optimizer = ft.prepare(model, optimizer)

def after_step(step):
    ft.checkpoint(model, optimizer, step=step, every=EVERY, async_save=True)
    if step == stop_at:
        assert ft.wait_for_checkpoint(timeout=120)
        return True
    return False

train(model, optimizer, ft.start_step(), total, after_step)
ft.wait_for_checkpoint(timeout=120)
dist.destroy_process_group()
""".replace("EVERY", str(STOP_AT))

# By hand, without flashruntime: PyTorch's own DCP load of the step directory, then on.
BY_HAND = MODEL + """
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
step_dir, start, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
model, optimizer = build()
model_state, optimizer_state = get_state_dict(model, optimizer)
state = {"model": model_state, "optim": optimizer_state}
dcp.load(state, checkpoint_id=step_dir)
set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
train(model, optimizer, start, total, lambda step: False)
dist.destroy_process_group()
"""


def _launch(tmp_path: Path, name: str, script: str, nproc: int, ckpt: Path, *args: object) -> dict[int, float]:
    out = tmp_path / name
    out.mkdir()
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(script))
    env = {**_env(out, ckpt), "FLASHML_JOB_ID": name, "FLASHML_ATTEMPT_ID": name}
    argv = [*torchrun_argv(), f"--nproc-per-node={nproc}", "--standalone", "--local-addr=127.0.0.1", str(path),
            *map(str, args)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {record["step"]: record["loss"] for record in map(json.loads, (out / "losses.jsonl").open())}


def test_an_fsdp2_checkpoint_resumes_at_two_ranks_and_at_one(tmp_path: Path) -> None:
    from flashruntime.checkpoint.local import latest_valid_manifest

    straight = _launch(tmp_path, "straight", WITH_FT, 2, tmp_path / "ckpt-straight", TOTAL, 0)
    assert sorted(straight) == list(range(1, TOTAL + 1))

    saved = tmp_path / "ckpt-saved"
    first = _launch(tmp_path, "first", WITH_FT, 2, saved, TOTAL, STOP_AT)
    assert sorted(first) == list(range(1, STOP_AT + 1))
    manifest = latest_valid_manifest(saved)
    assert manifest is not None and (manifest.step, manifest.world_size) == (STOP_AT, 2)
    assert sorted(part.key for part in manifest.parts) == [".metadata", "__0_0.distcp", "__1_0.distcp", "resume.pt"]

    for ranks in (2, 1):
        shutil.copytree(saved, tmp_path / f"ckpt-{ranks}")
    at_two = _launch(tmp_path, "resumed-2", WITH_FT, 2, tmp_path / "ckpt-2", TOTAL, 0)
    assert sorted(at_two) == list(range(STOP_AT + 1, TOTAL + 1))  # not from step 0
    for step, loss in at_two.items():
        assert loss == pytest.approx(straight[step], abs=1e-6), step

    at_one = _launch(tmp_path, "resumed-1", WITH_FT, 1, tmp_path / "ckpt-1", TOTAL, 0)
    by_hand = _launch(tmp_path, "by-hand-1", BY_HAND, 1, tmp_path / "unused",
                      saved / f"step-{STOP_AT:06d}", STOP_AT, TOTAL)
    assert sorted(at_one) == sorted(by_hand) == list(range(STOP_AT + 1, TOTAL + 1))
    for step, loss in at_one.items():
        assert loss == pytest.approx(by_hand[step], abs=1e-6), step
        assert loss == pytest.approx(straight[step], rel=1e-4), step  # the same global batch at either size
    resumed = latest_valid_manifest(tmp_path / "ckpt-1")
    assert resumed is not None and (resumed.step, resumed.world_size) == (TOTAL, 1)
