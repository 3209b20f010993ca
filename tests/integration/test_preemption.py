"""A SIGTERM to the process running ``flash.submit`` is a preemption notice: the ranks of a
2-rank ``flashruntime.torch`` job (torchrun, gloo) save the same step, leave within the grace,
the attempt ends PREEMPTED without spending a restart, and a re-run with the same output
directory resumes from that step and ends exactly where an uninterrupted run ends.
An unmodified script gets the signal forwarded and the grace, then is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.checkpoint.local import latest_valid_manifest
from flashruntime.launchers import LaunchState
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT, pid_alive, wait_until

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOTAL, PAUSE_AT, EVERY = 60, 23, 50

# At PAUSE_AT (after that step's update, before its checkpoint call) every rank of the first
# run waits for the test's go: the SIGTERM lands at a known step.
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft
    from torch.utils.data import DataLoader, TensorDataset

    total, pause_at, every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = ft.prepare(model, optimizer, loader)
    out = os.environ["FLASHML_OUTPUT_DIR"]
    go = os.environ.get("PREEMPT_GO") or os.path.join(out, "..", "..", "go")
    batches = iter(loader)
    for step in range(ft.start_step(), total):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        if step + 1 == pause_at:
            open(os.path.join(out, f"paused-{ft.rank()}"), "w").close()
            deadline = time.monotonic() + 240  # a hang guard only
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
        ft.checkpoint(model, optimizer, step=step + 1, every=every)
    if ft.is_main():
        weights = [round(float(p.detach().sum()), 10) for p in model.parameters()]
        json.dump({"final_loss": loss.item(), "weights": weights}, open(os.path.join(out, "metrics.json"), "w"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")

DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    import flashruntime as flash
    from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
    workload = CommandWorkload(command=json.loads(sys.argv[1]), source=Source(path=sys.argv[2]),
                               env={{"PYTHONPATH": {repo!r}, "OMP_NUM_THREADS": "1"}}, outputs=OutputSpec(collect=[]))
    flash.submit(workload, output_dir=sys.argv[3], watch=False, quiet=True, max_restarts=1)
""").format(repo=str(REPO_ROOT))


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _command(pause_at: int, *, script: str = "train.py") -> list[str]:
    return [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", script, str(TOTAL),
            str(pause_at), str(EVERY)]


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    return source


def _submit(source: Path, out: Path) -> flash.Run:
    workload = CommandWorkload(command=_command(0), source=Source(path=str(source)),
                               env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                               outputs=OutputSpec(collect=[]))
    return flash.submit(workload, output_dir=out, watch=False, quiet=True, max_restarts=1)


def _driver(command: list[str], source: Path, out: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(command), str(source), str(out)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(doc: dict, kind: str) -> list[str]:
    return [e["message"] for e in doc["events"] if e["type"] == kind]


def _steps(attempt_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (attempt_dir / "metrics.jsonl").read_text().splitlines()]


def _preempt_at_the_pause(driver: subprocess.Popen[str], out: Path) -> tuple[str, str]:
    attempt = out / "local" / "task-000"
    try:
        wait_until(lambda: all((attempt / f"paused-{rank}").exists() for rank in (0, 1)), "both ranks at the pause",
                   timeout=240)
        driver.send_signal(signal.SIGTERM)
        wait_until(lambda: bool(_events(json.loads((out / "run.json").read_text()), "PREEMPTION_NOTICE")),
                   "the notice to be forwarded", timeout=60)
        (out / "go").touch()
        return driver.communicate(timeout=240)
    finally:
        (out / "go").touch()
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_sigterm_to_submit_saves_the_same_step_on_both_ranks_and_the_rerun_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = _source(tmp_path)
    straight = _submit(source, tmp_path / "straight")
    assert straight.state is LaunchState.SUCCEEDED, straight.logs()

    out = tmp_path / "preempted"
    driver = _driver(_command(PAUSE_AT), source, out, FLASHML_PREEMPT_GRACE_S="120")
    _, stderr = _preempt_at_the_pause(driver, out)
    assert driver.returncode == -signal.SIGTERM, stderr

    doc = json.loads((out / "run.json").read_text())
    assert doc["state"] == "CANCELLED"
    [row] = doc["attempts"]  # no relaunch: the restart budget is not spent
    assert row["state"] == "PREEMPTED" and "failure" not in row
    preempted = row["preempted"]
    assert preempted["signal"] == "SIGTERM" and preempted["within_grace"] is True
    assert preempted["saved_step"] in (PAUSE_AT, PAUSE_AT + 1)
    assert preempted["ranks_saved"] == [0, 1] and len(preempted["forwarded_to"]) == 2
    records = [json.loads((out / "local" / "task-000" / "ranks" / f"rank-{r}.preempted.json").read_text())
               for r in (0, 1)]
    assert {rec["step"] for rec in records} == {preempted["saved_step"]}
    manifest = latest_valid_manifest(out / "local" / "ckpt")
    assert manifest is not None and manifest.step == preempted["saved_step"] and manifest.world_size == 2
    assert not _events(doc, "FAILURE_CLASSIFIED") and not _events(doc, "RECOVERY_ACTION_SELECTED")
    assert f"every rank (2) saved step {preempted['saved_step']}" in _events(doc, "ATTEMPT_PREEMPTED")[0]
    assert doc["events"][-1] == {**doc["events"][-1], "type": "RUN_PREEMPTED",
                                 "message": f"run preempted (task-000 saved step {preempted['saved_step']})"}
    reached = max(_steps(out / "local" / "task-000"))

    resumed = _submit(source, out)
    assert resumed.state is LaunchState.SUCCEEDED, resumed.logs()
    assert _events(json.loads((out / "run.json").read_text()), "RESUME_SELECTED")[0].startswith(
        f"task-000 resumes from step {preempted['saved_step']} ")
    steps = _steps(out / "local" / "task-000")
    assert steps[0] == preempted["saved_step"] + 1 and steps[-1] == TOTAL
    assert reached - preempted["saved_step"] <= 1  # steps the preemption lost
    final = json.loads((out / "local" / "task-000" / "metrics.json").read_text())
    expected = json.loads((tmp_path / "straight" / "local" / "task-000" / "metrics.json").read_text())
    assert final["final_loss"] == pytest.approx(expected["final_loss"], abs=1e-6)
    assert final["weights"] == pytest.approx(expected["weights"], abs=1e-6)


# A plain script under torchrun: no flashruntime.torch, no handler of its own.
PLAIN = textwrap.dedent("""
    import os, time
    open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "pid-" + os.environ["RANK"]), "w").write(str(os.getpid()))
    time.sleep(300)
""")


def test_an_unmodified_script_gets_the_signal_and_the_grace_then_the_attempt_is_preempted(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "plain.py").write_text(PLAIN)
    out = tmp_path / "out"
    command = [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "plain.py"]
    driver = _driver(command, source, out, FLASHML_PREEMPT_GRACE_S="120")
    attempt = out / "local" / "task-000"
    try:
        wait_until(lambda: all((attempt / f"pid-{r}").exists() and (attempt / f"pid-{r}").read_text()
                               for r in (0, 1)), "both ranks to start", timeout=240)
        ranks = sorted(int((attempt / f"pid-{r}").read_text()) for r in (0, 1))
        driver.send_signal(signal.SIGTERM)
        _, stderr = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == -signal.SIGTERM, stderr
    doc = json.loads((out / "run.json").read_text())
    [row] = doc["attempts"]
    assert row["state"] == "PREEMPTED" and "failure" not in row
    assert sorted(row["preempted"]["forwarded_to"]) == ranks  # the ranks, not torchrun
    assert row["preempted"]["saved_step"] is None and row["preempted"]["within_grace"] is True
    assert "no save after the notice was reported" in _events(doc, "ATTEMPT_PREEMPTED")[0]
    assert doc["events"][-1]["message"] == "run preempted (task-000 stopped)"
    assert not any(pid_alive(pid) for pid in ranks)


def _signal_once_started(driver: subprocess.Popen[str], out: Path, signum: int) -> tuple[int, str]:
    """Send ``signum`` to the process driving the run in ``out`` once its attempt's command has
    written its pid; → (that pid, the driver's stderr) after the driver ended."""
    pid_file = out / "local" / "task-000" / "pid"
    try:
        wait_until(lambda: pid_file.exists() and bool(pid_file.read_text()), "the attempt to start", timeout=60)
        child = int(pid_file.read_text())
        driver.send_signal(signum)
        _, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return child, stderr


def test_the_configured_signal_to_the_submit_cli_is_forwarded_to_the_command(tmp_path: Path) -> None:
    """As Slurm's ``--signal=USR1@90`` sends it: the CLI forwards it, then dies of it."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "sleeper.py").write_text("import os, time\nopen(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'pid'), 'w')"
                                    ".write(str(os.getpid()))\ntime.sleep(300)\n")
    cli = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", "submit", f"{sys.executable} sleeper.py",
                            "--source", str(src), "--output-dir", str(out), "--no-watch"],
                           env={**os.environ, "FLASHML_PREEMPT_SIGNAL": "USR1", "PYTHONPATH": str(REPO_ROOT)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    child, stderr = _signal_once_started(cli, out, signal.SIGUSR1)
    assert cli.returncode == -signal.SIGUSR1, stderr
    doc = json.loads((out / "run.json").read_text())
    [row] = doc["attempts"]
    assert (row["state"], row["exit_code"], row["preempted"]["forwarded_to"]) == ("PREEMPTED", -signal.SIGUSR1, [child])
    assert _events(doc, "PREEMPTION_NOTICE")[0].startswith(f"task-000: SIGUSR1 forwarded to pid {child}; ")
    assert not pid_alive(child)


# wait=False: the signal lands while the main thread waits on the run, a thread drives it.
BACKGROUND = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    import flashruntime as flash
    code = "import os, time; open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'pid'), 'w').write(str(os.getpid()))"
    run = flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", code + "; time.sleep(300)"]),
                       output_dir=sys.argv[1], watch=False, quiet=True, wait=False, max_restarts=2)
    run.wait()
""").format(repo=str(REPO_ROOT))


def test_a_run_driven_on_a_thread_is_preempted_too(tmp_path: Path) -> None:
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-c", BACKGROUND, str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    child, stderr = _signal_once_started(driver, out, signal.SIGTERM)
    assert driver.returncode == -signal.SIGTERM, stderr
    doc = json.loads((out / "run.json").read_text())
    [row] = doc["attempts"]  # two restarts allowed, none spent
    assert (doc["state"], row["state"], row["preempted"]["forwarded_to"]) == ("CANCELLED", "PREEMPTED", [child])
    assert [e["type"] for e in doc["events"]][-1] == "RUN_PREEMPTED"
    assert not pid_alive(child)
