"""preemption_loss: a 2-rank torchrun job (gloo) gets a SIGTERM at step 137; the steps the
resumed run recomputes, when ``flash.submit`` forwards the notice and every rank saves that
step, against bare torchrun, where the ranks die of it and the script's own periodic
checkpoint (every 50 steps, at 100) is what is left. The same script in both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.scenarios._torchrun import torchrun_argv
from benchmarks.targets import PREEMPTION_STEPS_LOST

NAME, SECTION = "preemption_loss", "resilience"
REPO_ROOT = Path(__file__).resolve().parents[2]
TOTAL, SIGNAL_AT, EVERY = 150, 137, 50
SMOKE_TOTAL, SMOKE_SIGNAL_AT, SMOKE_EVERY = 20, 13, 5
_WAIT_S = 300  # a hang guard for each phase, never a measurement

# Every rank waits at SIGNAL_AT (after the step's update, before its checkpoint call) for the
# go file, so the SIGTERM lands at the same step in both arms.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    import flashruntime.torch as ft

    total, pause_at, every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = ft.prepare(model, optimizer)
    out, go = os.environ["FLASHML_OUTPUT_DIR"], os.environ["PREEMPT_GO"]
    for step in range(ft.start_step(), total):
        x = torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        if step + 1 == pause_at:
            open(os.path.join(out, f"paused-{ft.rank()}"), "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
        ft.checkpoint(model, optimizer, step=step + 1, every=every)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")

DRIVER = textwrap.dedent("""
    import json, sys
    import flashruntime as flash
    from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
    workload = CommandWorkload(command=json.loads(sys.argv[1]), source=Source(path=sys.argv[2]),
                               outputs=OutputSpec(collect=[]))
    flash.submit(workload, output_dir=sys.argv[3], watch=False, quiet=True)
""")


def _env(go: Path) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID",
            "FLASHML_PREEMPT_SIGNAL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PREEMPT_GO=str(go), OMP_NUM_THREADS="1", FLASHML_PREEMPT_GRACE_S="120",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
    return env


def _wait(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + _WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"preemption_loss: gave up waiting for {what}")
        time.sleep(0.05)


def _max_step(attempt_dir: Path) -> int:
    lines = (attempt_dir / "metrics.jsonl").read_text().splitlines()
    return max(json.loads(line)["step"] for line in lines if line.strip())


def _saved(ckpt: Path) -> int:
    from flashruntime.checkpoint.local import latest_valid_manifest

    manifest = latest_valid_manifest(ckpt)
    return 0 if manifest is None else manifest.step


def _finish(process: subprocess.Popen[bytes], go: Path) -> int:
    go.touch()
    try:
        return process.wait(timeout=_WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _ours(work: Path, args: list[str]) -> tuple[int, bool]:
    """(steps lost, whether the attempt ended PREEMPTED within its grace) under flash.submit."""
    source, out, go = work / "src", work / "ours", work / "go-ours"
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", *args]
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(command), str(source), str(out)],
                              env=_env(go), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    attempt = out / "local" / "task-000"
    try:
        _wait(lambda: all((attempt / f"paused-{r}").exists() for r in (0, 1)), "both ranks at the signal step")
        driver.send_signal(signal.SIGTERM)

        def forwarded() -> bool:
            try:
                doc = json.loads((out / "run.json").read_text())
            except (OSError, ValueError):
                return False
            return any(e["type"] == "PREEMPTION_NOTICE" for e in doc["events"])

        _wait(forwarded, "the notice to reach the ranks")
    finally:
        _finish(driver, go)
    row = json.loads((out / "run.json").read_text())["attempts"][0]
    preempted = row.get("preempted") or {}
    ok = row["state"] == "PREEMPTED" and preempted.get("within_grace") is True
    return _max_step(attempt) - _saved(out / "local" / "ckpt"), ok


def _bare_torchrun(work: Path, args: list[str]) -> int:
    """Steps lost under plain torchrun: the SIGTERM ends the ranks; the periodic checkpoint remains."""
    out, ckpt, go = work / "bare" / "task-000", work / "bare" / "ckpt", work / "go-bare"
    out.mkdir(parents=True)
    env = {**_env(go), "FLASHML_OUTPUT_DIR": str(out), "FLASHML_CKPT_DIR": str(ckpt)}
    process = subprocess.Popen([*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1",
                                str(work / "src" / "train.py"), *args], env=env, cwd=work / "src",
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: all((out / f"paused-{r}").exists() for r in (0, 1)), "both ranks at the signal step")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=_WAIT_S)
    finally:
        _finish(process, go)
    return _max_step(out) - _saved(ckpt)


def run(repeats: int, smoke: bool) -> list[dict]:
    samples = 1 if smoke else max(3, repeats)
    total, at, every = (SMOKE_TOTAL, SMOKE_SIGNAL_AT, SMOKE_EVERY) if smoke else (TOTAL, SIGNAL_AT, EVERY)
    args = [str(total), str(at), str(every)]
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    ours, bare, clean = [], [], []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            work = Path(tmp)
            (work / "src").mkdir()
            (work / "src" / "train.py").write_text(SCRIPT)
            lost, ok = _ours(work, args)
            ours.append(float(lost))
            clean.append(1.0 if ok else 0.0)
            bare.append(float(_bare_torchrun(work, args)))
    notes = [(f"2 ranks (torchrun, gloo), {total} steps, SIGTERM at step {at}; the script checkpoints every {every} "
              f"steps itself; ours: flash.submit forwards the notice (grace 120 s); preempted within the grace in "
              f"{int(sum(clean))} of {samples}")]
    return [
        measured_row(NAME, SECTION, "steps_lost", "steps", ours, target=PREEMPTION_STEPS_LOST,
                     comparator=("torchrun, periodic checkpoint", bare), notes=notes),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a preempted job saves inside its grace window and loses at most one step, where plain torchrun "
               "loses everything since its last periodic checkpoint",
    section=SECTION,
    run=run,
)
