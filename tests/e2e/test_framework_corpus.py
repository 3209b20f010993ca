"""Unchanged framework scripts (tests/e2e/frameworks/, written as each framework's docs show,
without a line for flashruntime) under flash.submit: one rank is SIGKILLed mid-run, the run
restarts, the script resumes from its own newest checkpoint, the resume event names that
step, and the final figure equals the script's bare run resumed by hand from the same
checkpoint. A checkpoint changed or torn after it was written is quarantined and the one
before it used."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.local.run import Run
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.frameworks]

CORPUS = Path(__file__).parent / "frameworks"
PY = sys.executable
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def _need(module: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip(module)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _project(tmp_path: Path, script: str) -> Path:
    source = tmp_path / "project"
    source.mkdir()
    shutil.copy(CORPUS / script, source / script)
    return source


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _attempt_pids(attempt_id: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _environ(int(entry.name)).get("FLASHML_ATTEMPT_ID") == attempt_id:
            pids.append(int(entry.name))
    return sorted(pids)


def rank_one(attempt_id: str) -> int | None:
    """The process that is rank 1 of the attempt: RANK or LOCAL_RANK 1 (torchrun, accelerate,
    Lightning's launcher), else the second rank torch.multiprocessing.spawn started."""
    pids = _attempt_pids(attempt_id)
    for pid in pids:
        env = _environ(pid)
        if env.get("RANK", env.get("LOCAL_RANK")) == "1":
            return pid
    spawned = [pid for pid in pids if "spawn_main" in _cmdline(pid)]
    return spawned[1] if len(spawned) >= 2 else None


def leader(attempt_id: str) -> int | None:
    pids = _attempt_pids(attempt_id)
    return pids[0] if pids else None


class Interruption:
    """Once a checkpoint event matching ``seen`` appears in the run's events: stop every process
    of the attempt (so nothing more is saved), let the watch settle, do ``before(source, run)``
    (corrupt a file, say; what it returns is kept as ``note``), copy ``keep`` (the checkpoints
    exactly as the relaunch will find them) aside for the reference run, SIGKILL the process
    ``target`` names and let the others go on, to find their peer gone."""

    def __init__(self, seen: str, target: Callable[[str], int | None], keep: list[str], *,
                 before: Callable[[Path, Run], Any] | None = None) -> None:
        self.seen = re.compile(seen)
        self.target = target
        self.keep = keep
        self.before = before
        self.note: Any = None
        self.killed: int | None = None
        self.kept: Path | None = None
        self.error: str | None = None

    def watch(self, run: Run, source: Path, kept: Path) -> threading.Thread:
        def loop() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not run.recorder.done.is_set():
                if any(e["type"] == "CHECKPOINT_SEEN" and self.seen.search(e["message"]) for e in run.events):
                    break
                time.sleep(0.05)
            else:
                self.error = f"no checkpoint matching {self.seen.pattern!r} was seen"
                return
            attempt_id = run.attempts[0]["attempt_id"]
            pid = self.target(attempt_id)
            if pid is None:
                self.error = "the process to kill was not found"
                return
            stopped = _attempt_pids(attempt_id)
            for other in stopped:
                os.kill(other, signal.SIGSTOP)
            time.sleep(1.5)  # the watch fingerprints what was finished when everything stopped
            if self.before is not None:
                self.note = self.before(source, run)
            for name in self.keep:
                origin = source / name
                if origin.is_dir():
                    shutil.copytree(origin, kept / name, symlinks=True)
                elif origin.exists():
                    (kept / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, kept / name)
            self.kept = kept
            os.kill(pid, signal.SIGKILL)
            self.killed = pid
            for other in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGCONT)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread


def _fingerprinted_steps(run: Run, pattern: str) -> list[int]:
    """The steps of the checkpoints matching ``pattern`` (with a group for the step) seen so far."""
    return sorted({int(m.group(1)) for e in run.events if e["type"] == "CHECKPOINT_SEEN"
                   for m in [re.search(pattern, e["message"])] if m})


def _submit(tmp_path: Path, source: Path, command: str, interruption: Interruption, **kwargs: Any) -> Run:
    workload = CommandWorkload(command=command, source=Source(path=str(source)), env=ENV,
                               outputs=OutputSpec(collect=["metrics.json"]))
    run = flash.submit(workload, output_dir=tmp_path / "run", watch=False, quiet=True, wait=False, max_restarts=2,
                       **kwargs)
    kept = tmp_path / "kept"
    kept.mkdir()
    interruption.watch(run, source, kept).join(300)
    run.wait(timeout=600)
    assert interruption.error is None, interruption.error + "\n" + run.logs(80)
    return run


def _events(run: Run, kind: str) -> list[str]:
    return [e["message"] for e in run.events if e["type"] == kind]


def _resumed_step(run: Run) -> int:
    resumes = _events(run, "RESUME_SELECTED")
    assert len(resumes) == 1, resumes
    match = re.search(r"resumes from (?:step|epoch) ([0-9]+)", resumes[0])
    assert match, resumes[0]
    return int(match.group(1))


def _check_restarted(run: Run, killed: int | None) -> None:
    assert run.state is LaunchState.SUCCEEDED, run.logs(120)
    assert len(run.attempts) == 2, ([(a["attempt_id"], a.get("exit_code"), a.get("failure")) for a in run.attempts],
                                    run.logs(120))
    failure = run.attempts[0]["failure"]
    assert failure["class"] == "worker_crash", failure
    assert failure["action"] != "fail_job"
    assert killed is not None


def _bare(reference: Path, argv: list[str], kept: Path) -> subprocess.CompletedProcess[str]:
    """The script run bare (no flashruntime) from the checkpoints kept at the kill."""
    for entry in kept.iterdir():
        target = reference / entry.name
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHML_", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                    "MASTER_"))}
    env.update(ENV)
    done = subprocess.run(argv, cwd=reference, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _attempt_log(run: Run, index: int) -> str:
    return (Path(run.attempts[index]["output_dir"]) / "launcher.log").read_text(errors="replace")


def test_hugging_face_trainer_killed_mid_run_resumes_from_its_newest_checkpoint(tmp_path: Path) -> None:
    _need("transformers")
    source = _project(tmp_path, "hf_clm.py")
    interruption = Interruption(r"checkpoint-20 \(step 20\) fingerprinted", lambda attempt: leader(attempt),
                                ["clm-out"])
    run = _submit(tmp_path, source, f"{PY} hf_clm.py", interruption)
    _check_restarted(run, interruption.killed)
    step = _resumed_step(run)
    assert step >= 20
    assert f"huggingface checkpoint clm-out/checkpoint-{step} (step {step}), verified" in \
        _events(run, "RESUME_SELECTED")[0]
    assert f"resuming training at clm-out/checkpoint-{step}" in _attempt_log(run, 1)
    ours = json.loads((source / "clm-out" / "all_results.json").read_text())
    reference = tmp_path / "reference"
    shutil.copytree(CORPUS, reference, ignore=shutil.ignore_patterns("__pycache__"))
    for later in (interruption.kept / "clm-out").glob("checkpoint-*"):
        if int(later.name.split("-")[1]) > step:
            shutil.rmtree(later)  # a save the kill interrupted: not what the relaunch resumed from
    _bare(reference, [PY, "hf_clm.py"], interruption.kept)
    theirs = json.loads((reference / "clm-out" / "all_results.json").read_text())
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=1e-6)
    assert run.trials and run.trials[0]["eval_loss"] == pytest.approx(ours["eval_loss"], abs=1e-9)
    # The run page's curve: the losses the Trainer printed, each at its step, for both attempts.
    from flashruntime.viewer.state import collect

    page = collect(run.output_dir)
    assert [a["metrics_records"] >= 2 for a in page["attempts"]] == [True, True]
    curve = [json.loads(line) for line in
             (Path(run.attempts[1]["output_dir"]) / "framework-metrics.jsonl").read_text().splitlines()]
    steps = [point["step"] for point in curve]
    assert steps == sorted(steps) and 30 <= steps[-1] <= 40  # the bar's count when the Trainer printed its loss
    assert all(isinstance(point["loss"], float) for point in curve)


def _flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size - 100)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_flipped_byte_in_the_newest_hf_checkpoint_is_quarantined_and_the_one_before_used(tmp_path: Path) -> None:
    _need("transformers")
    source = _project(tmp_path, "hf_clm.py")

    def flip_the_newest(src: Path, run: Run) -> int:
        step = _fingerprinted_steps(run, r"checkpoint-([0-9]+) \(step [0-9]+\) fingerprinted")[-1]
        _flip_a_byte(src / "clm-out" / f"checkpoint-{step}" / "model.safetensors")
        return step

    interruption = Interruption(r"checkpoint-20 \(step 20\) fingerprinted", lambda attempt: leader(attempt), [],
                                before=flip_the_newest)
    run = _submit(tmp_path, source, f"{PY} hf_clm.py --save_steps 10 --max_steps 60", interruption)
    _check_restarted(run, interruption.killed)
    flipped = interruption.note
    quarantined = _events(run, "CHECKPOINT_QUARANTINED")
    flipped_words = (f"huggingface checkpoint clm-out/checkpoint-{flipped} (step {flipped}) is not resumable: "
                     "model.safetensors changed since it was written (sha256 differs)")
    assert [flipped_words in message for message in quarantined].count(True) == 1
    # Besides it, only a save the stop caught half-written can have been moved aside.
    assert all("trainer_state.json is missing" in message for message in quarantined if flipped_words not in message)
    quarantine = tmp_path / "run" / "local" / "quarantine"
    assert (quarantine / "clm-out" / f"checkpoint-{flipped}" / "model.safetensors").is_file()
    assert _resumed_step(run) == flipped - 10
    assert f"resuming training at clm-out/checkpoint-{flipped - 10}" in _attempt_log(run, 1)
    assert len(run.attempts) == 2  # one restart spent


def test_lightning_ddp_with_its_own_launcher_resumes_from_last_ckpt(tmp_path: Path) -> None:
    _need("lightning")
    source = _project(tmp_path, "lightning_ddp.py")
    interruption = Interruption(r"lightning checkpoint checkpoints/epoch=[0-9]+-step=20\.ckpt \(step 20\) fingerprinted",
                                rank_one, ["checkpoints"])
    run = _submit(tmp_path, source, f"{PY} lightning_ddp.py --step_seconds 0.25", interruption)
    _check_restarted(run, interruption.killed)
    step = _resumed_step(run)
    assert step >= 20
    assert f"(step {step})" in _events(run, "RESUME_SELECTED")[0]
    assert f"rank 1 (pid {interruption.killed}) exited first" in _events(run, "FAILURE_CLASSIFIED")[0]
    ours = _last_val_loss(source)
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(CORPUS / "lightning_ddp.py", reference)
    kept = interruption.kept / "checkpoints"
    for later in kept.glob("epoch=*-step=*.ckpt"):
        if int(re.search(r"step=([0-9]+)", later.name).group(1)) > step:
            later.unlink()
    _bare(reference, [PY, "lightning_ddp.py", "--step_seconds", "0"], interruption.kept)
    assert ours == pytest.approx(_last_val_loss(reference), abs=1e-6)
    assert run.trials[0]["val_loss"] == pytest.approx(ours, abs=1e-9)


def _last_val_loss(root: Path) -> float:
    import csv

    rows = list(csv.DictReader((root / "logs" / "regressor" / "version_0" / "metrics.csv").open()))
    return float([row for row in rows if row.get("val_loss")][-1]["val_loss"])


def test_accelerate_launch_with_save_state_resumes_from_its_newest_step_directory(tmp_path: Path) -> None:
    _need("accelerate")
    source = _project(tmp_path, "accelerate_ddp.py")
    accelerate = Path(PY).with_name("accelerate")
    command = f"{accelerate} launch --multi_gpu --num_processes 2 --main_process_port {_free_port()} accelerate_ddp.py"
    interruption = Interruption(r"accelerate checkpoint acc-out/step_16 \(step 16\) fingerprinted", rank_one,
                                ["acc-out"])
    run = _submit(tmp_path, source, command, interruption)
    _check_restarted(run, interruption.killed)
    step = _resumed_step(run)
    assert step >= 16
    assert f"accelerate checkpoint acc-out/step_{step} (step {step}), verified" in _events(run, "RESUME_SELECTED")[0]
    assert f"Resumed from checkpoint: step_{step}" in _attempt_log(run, 1)
    ours = run.trials[0]  # the JSON line the script printed
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(CORPUS / "accelerate_ddp.py", reference)
    for later in (interruption.kept / "acc-out").glob("step_*"):
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    done = _bare(reference, [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
                             _free_port(), "accelerate_ddp.py"], interruption.kept)
    theirs = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert ours["final_loss"] == pytest.approx(theirs["final_loss"], abs=1e-6)
    assert ours["weight_norm"] == pytest.approx(theirs["weight_norm"], abs=1e-6)


def test_torch_multiprocessing_spawn_killed_rank_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    _need("torch")
    source = _project(tmp_path, "spawn_ddp.py")
    port = _free_port()
    interruption = Interruption(r"pattern checkpoint checkpoint\.pt \(step (2|3)0\) fingerprinted", rank_one,
                                ["checkpoint.pt"])
    run = _submit(tmp_path, source, f"{PY} spawn_ddp.py {port} 0.2", interruption, checkpoints="checkpoint.pt")
    _check_restarted(run, interruption.killed)
    failure = run.attempts[0]["failure"]
    assert "torch.multiprocessing.spawn saw a rank killed" in failure["evidence"], failure
    step = _resumed_step(run)
    assert step >= 20
    assert f"rank 0 resumed at step {step}" in _attempt_log(run, 1)
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(CORPUS / "spawn_ddp.py", reference)
    _bare(reference, [PY, "spawn_ddp.py", _free_port(), "0"], interruption.kept)
    theirs = json.loads((reference / "metrics.json").read_text())
    assert run.trials[0]["final_loss"] == pytest.approx(theirs["final_loss"], abs=1e-6)


def _torchrun() -> str:
    beside = Path(PY).with_name("torchrun")
    return str(beside) if beside.exists() else f"{PY} -m torch.distributed.run"


def _truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def test_torchrun_snapshot_killed_rank_resumes_from_its_snapshot(tmp_path: Path) -> None:
    _need("torch")
    source = _project(tmp_path, "torchrun_snapshot.py")
    command = f"{_torchrun()} --nproc-per-node=2 --standalone --local-addr=127.0.0.1 torchrun_snapshot.py 8 2 --step_seconds 0.3"
    interruption = Interruption(r"pattern checkpoint snapshot\.pt \(epoch 4\) fingerprinted", rank_one,
                                ["snapshot.pt"])
    run = _submit(tmp_path, source, command, interruption, checkpoints="snapshot.pt")
    _check_restarted(run, interruption.killed)
    epoch = _resumed_step(run)
    assert epoch >= 4
    assert f"Resuming training from snapshot at Epoch {epoch}" in _attempt_log(run, 1)
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(CORPUS / "torchrun_snapshot.py", reference)
    _bare(reference, [*_torchrun().split(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1",
                      "torchrun_snapshot.py", "8", "2", "--step_seconds", "0"], interruption.kept)
    theirs = json.loads((reference / "metrics.json").read_text())
    assert run.trials[0]["weights"] == theirs["weights"]
    assert run.trials[0]["final_loss"] == pytest.approx(theirs["final_loss"], abs=1e-6)


def test_a_truncated_snapshot_is_quarantined_and_the_kept_copy_restored(tmp_path: Path) -> None:
    _need("torch")
    source = _project(tmp_path, "torchrun_snapshot.py")
    command = f"{_torchrun()} --nproc-per-node=2 --standalone --local-addr=127.0.0.1 torchrun_snapshot.py 8 2 " \
              "--step_seconds 0.3"

    def truncate(src: Path, run: Run) -> int:
        _truncate(src / "snapshot.pt")
        return _fingerprinted_steps(run, r"snapshot\.pt \(epoch ([0-9]+)\) fingerprinted")[-1]

    interruption = Interruption(r"pattern checkpoint snapshot\.pt \(epoch 4\) fingerprinted", rank_one, [],
                                before=truncate)
    run = _submit(tmp_path, source, command, interruption, checkpoints="snapshot.pt")
    _check_restarted(run, interruption.killed)
    quarantined = _events(run, "CHECKPOINT_QUARANTINED")
    assert len(quarantined) == 1 and "pattern checkpoint snapshot.pt" in quarantined[0]
    assert re.search(r"is not resumable: snapshot\.pt is [0-9]+ bytes, [0-9]+ when it was written", quarantined[0])
    kept_epoch = interruption.note  # the last version fingerprinted: its copy is what comes back
    assert [f"snapshot.pt (epoch {kept_epoch})" in m for m in _events(run, "CHECKPOINT_RESTORED")] == [True]
    assert (tmp_path / "run" / "local" / "quarantine" / "snapshot.pt").is_file()
    assert _resumed_step(run) == kept_epoch
    assert f"Resuming training from snapshot at Epoch {kept_epoch}" in _attempt_log(run, 1)
    assert len(run.attempts) == 2


def test_chaos_on_an_unchanged_hf_script_kills_and_corrupts_at_its_own_checkpoints(tmp_path: Path) -> None:
    _need("transformers")
    source = _project(tmp_path, "hf_clm.py")
    done = subprocess.run(
        [PY, "-m", "flashruntime.cli", "chaos", f"{PY} hf_clm.py --max_steps 30 --step_seconds 0.15",
         "--corrupt-checkpoint", "20", "--kill-attempt", "20", "--source", str(source),
         "--output-dir", str(tmp_path / "chaos"), "--metric", "eval_loss", "--json", "--quiet"],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **ENV})
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(f["kind"], f["done"]) for f in report["faults"]] == [("corrupt_checkpoint", True), ("kill_attempt", True)]
    assert "huggingface checkpoint clm-out/checkpoint-20 (step 20)" in report["faults"][0]["detail"]
    assert report["not_reached"] == [] and report["result"]["equal"] is True
    events = json.loads((tmp_path / "chaos" / "chaos" / "run.json").read_text())["events"]
    quarantined = [e["message"] for e in events if e["type"] == "CHECKPOINT_QUARANTINED"]
    assert len(quarantined) == 1 and "checkpoint-20" in quarantined[0]
    assert any(e["type"] == "RESUME_SELECTED" and "resumes from step 10" in e["message"] for e in events)


def test_chaos_exits_1_when_a_fault_could_not_be_injected(tmp_path: Path) -> None:
    source = tmp_path / "project"
    source.mkdir()
    (source / "t.py").write_text("import time\nfor _ in range(20):\n    time.sleep(0.05)\n")
    done = subprocess.run(
        [PY, "-m", "flashruntime.cli", "chaos", f"{PY} t.py", "--kill-rank", "1@5", "--source", str(source),
         "--output-dir", str(tmp_path / "chaos"), "--no-compare", "--json", "--quiet"],
        capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(done.stdout)
    assert report["state"] == "SUCCEEDED" and report["not_reached"] == [{"kind": "kill_rank", "step": 5}]
    assert done.returncode == 1


def test_a_scikit_learn_sweep_with_a_killed_trial_reports_each_trials_own_figure(tmp_path: Path) -> None:
    _need("sklearn")
    source = _project(tmp_path, "sklearn_cv.py")
    values = [0.1, 1.0, 10.0, 100.0]
    workload = CommandWorkload(command=f"{PY} sklearn_cv.py --C {{C}} --pause 1.5", source=Source(path=str(source)),
                               task_params=[{"C": c} for c in values], env=ENV,
                               outputs=OutputSpec(primary_metric="accuracy"))
    run = flash.submit(workload, output_dir=tmp_path / "run", watch=False, quiet=True, wait=False, max_restarts=1,
                       max_concurrent_trials=2)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and not run.recorder.done.is_set():
        pids = _attempt_pids("task-001")
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.05)
    run.wait(timeout=300)
    assert killed is not None and run.state is LaunchState.SUCCEEDED, run.logs(60)
    attempts = {row["attempt_id"] for row in run.attempts}
    assert {"task-001", "task-001-r1"} <= attempts
    assert next(a for a in run.attempts if a["attempt_id"] == "task-001")["failure"]["class"] == "worker_crash"
    alone = {}
    for c in values:
        bare = tmp_path / f"bare-{c}"
        bare.mkdir()
        subprocess.run([PY, str(CORPUS / "sklearn_cv.py"), "--C", str(c)], cwd=bare, check=True, timeout=120)
        alone[c] = json.loads((bare / "metrics.json").read_text())["accuracy"]
    assert {trial["params"]["C"]: trial["accuracy"] for trial in run.trials} == alone
    assert run.best_trial()["accuracy"] == max(alone.values())
