"""A rank that hangs forever is caught: a 2-rank gloo job under torchrun, driven by
flash.submit, whose rank 1 stops making progress at a step of its first attempt. The hang
watch names it, dumps both ranks' stacks into the attempt's evidence, stops the group, and
the relaunch resumes from the last checkpoint and succeeds."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.monitor.stacks import STACKS_NAME
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HANG_AT = 15
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft

    total, hang_at = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = ft.prepare(model, optimizer)
    first_attempt = os.environ["FLASHML_ATTEMPT_ID"] == "task-000"


    def hang_here():
        time.sleep(10 ** 6)


    for step in range(ft.start_step(), total):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if first_attempt and ft.rank() == 1 and step + 1 == hang_at:
            hang_here()
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        ft.checkpoint(model, optimizer, step=step + 1, every=5)
        time.sleep(0.1)
    if ft.is_main():
        with open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w") as out:
            json.dump({"final_step": step + 1, "start_step": ft.start_step()}, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
""")
GUARD_S = 300  # far beyond a hang timeout, a relaunch and 25 steps: only a watch that never fires gets here


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _submit(tmp_path: Path, **options: object) -> flash.Run:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    command = [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", "25",
               str(HANG_AT)]
    workload = CommandWorkload(command=command, source=Source(path=str(source)),
                               env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                               outputs=OutputSpec(collect=[]))
    run = flash.submit(workload, output_dir=tmp_path / "run", watch=False, quiet=True, max_restarts=1, wait=False,
                       **options)  # type: ignore[arg-type]
    if not run.wait(timeout=GUARD_S).terminal:
        run.cancel()
        pytest.fail(f"the run was still {run.state} after {GUARD_S} s:\n{run.logs(80)}")
    return run


def test_a_rank_hung_forever_is_caught_dumped_stopped_and_relaunched(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = _submit(tmp_path, hang_timeout_s=10)
    assert run.state is LaunchState.SUCCEEDED, run.logs(80)
    assert [(a["attempt_id"], a["state"]) for a in run.attempts] == [("task-000", "FAILED"),
                                                                      ("task-000-r1", "SUCCEEDED")]
    messages: dict[str, list[str]] = {}
    for event in run.events:
        messages.setdefault(event["type"], []).append(event["message"])
    detected = messages["HANG_DETECTED"]
    assert len(detected) == 1 and detected[0].startswith("task-000: no progress for "), detected
    assert "(hang timeout 10 s, by heartbeats)" in detected[0]
    failure = run.attempts[0]["failure"]
    assert failure["class"] == "hang"
    assert messages["FAILURE_CLASSIFIED"][0].startswith("task-000: hang (")
    assert messages["RECOVERY_ACTION_SELECTED"][0].startswith("task-000: restart_group — hung: no progress")
    assert messages["RESUME_SELECTED"] == ["task-000-r1 resumes from step 10 (" + messages["RESUME_SELECTED"][0]
                                           .split("(", 1)[1]]
    hang = failure["hang"]
    assert hang["idle_s"] >= 10 and hang["source"] == "heartbeats"
    assert {rank["rank"] for rank in hang["ranks"]} == {0, 1}
    assert hang["stalled_ranks"] and all(r["step"] is not None and r["step"] < HANG_AT for r in hang["stalled_ranks"])
    # The evidence: both ranks' stacks, the hung one inside the call that never returns.
    stacks = Path(hang["stacks"])
    assert stacks == tmp_path / "run" / "local" / "task-000" / STACKS_NAME
    text = stacks.read_text()
    blocks = {block.split(" (pid", 1)[0]: block for block in text.split("===== ")[1:]}
    assert set(blocks) == {"rank 0", "rank 1"}, text
    assert "hang_here" in blocks["rank 1"], text
    assert "no stack" not in text, text
    assert str(stacks) in failure["evidence"] and str(stacks) in detected[0]
    assert run.trials[-1] == {"final_step": 25, "start_step": 10}
    assert json.loads(run.run_json_path.read_text())["attempts"][0]["failure"]["hang"]["stacks"] == str(stacks)

