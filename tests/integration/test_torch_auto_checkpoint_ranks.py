"""``every="auto"`` under real torchrun with two gloo ranks: rank 0's figures are broadcast at
each save, so both ranks save at the same steps and neither waits at a barrier alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration._torchrun import _env, torchrun_argv

TRAIN = """\
import json, os, time
import torch
import flashruntime.torch as ft

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = ft.prepare(model, optimizer)
saves = []
for step in range(1, 41):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.002 * (1 + ft.rank()))  # the ranks' own pace differs; the cadence must not
    ft.checkpoint(model, optimizer, step=step, every="auto", mtbf_s=0.5)
    cadence = ft.checkpoint_cadence()
    if cadence is not None and (not saves or saves[-1][1] != cadence):
        saves.append((step, cadence))
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, f"auto-{ft.rank()}.json"), "w") as handle:
    json.dump([[step, c.interval_steps, c.checkpoint_s, c.step_time_s] for step, c in saves], handle)
"""


@pytest.mark.torch
def test_both_ranks_save_at_the_same_steps(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    argv = [*torchrun_argv(), "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
            str(script)]
    done = subprocess.run(argv, env=_env(out, ckpt), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((out / f"auto-{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1 and rank0[0][0] == 2  # same steps, same broadcast figures
    saved = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
    assert saved[0] == 2 and len(saved) >= 2
