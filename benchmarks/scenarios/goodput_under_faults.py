"""goodput_under_faults: a 2-rank CPU DDP job (torchrun, gloo) whose steps are padded to
``STEP_S`` seconds, with one rank SIGKILLed every ``KILL_EVERY_S`` seconds over a ``WINDOW_S``
second window; the share of the window that ended as kept training progress, under
``flash.submit`` against plain ``torchrun --max-restarts``.

Both arms run the same script, one after the other (never at once: the host has 2 cores):

- ours: ``flash.submit(CommandWorkload(torchrun ...), max_restarts=MAX_RESTARTS)`` in a
  driver subprocess; the script uses ``flashruntime.torch``: ``ft.prepare`` (process group,
  DDP, restore of the newest verified checkpoint), ``ft.start_step()``, ``ft.log_metrics`` and
  ``ft.checkpoint(model, optimizer, step=..., every="auto", async_save=True)`` with
  ``FLASHML_CHECKPOINT_MTBF_S`` set to the kill period, so the Young/Daly interval follows the
  fault rate. A killed rank ends the torchrun attempt; flash.submit relaunches the command.
- torchrun: ``torchrun --max-restarts=MAX_RESTARTS`` of the same script without flashruntime:
  DDP set up by hand, rank 0 ``torch.save``s model, optimizer and step every ``EVERY`` steps
  (to a temporary file then renamed over the checkpoint), and every rank loads that file at
  start when it exists, as PyTorch's elastic-training docs show. torchrun restarts its
  worker group itself.

Both arms set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch's default, a worker group
restarted in place by torchrun shares the agent's store with the group before it, and its
gloo ranks can read a dead predecessor's address and fail to connect ("Gloo connectFullMesh
failed ... Connection refused"), costing torchrun several more restarts per kill. Turning the
sharing off is torch's documented way out; it only makes the comparator stronger.

Every step is one forward/backward/update of a tiny model, its log line and its checkpoint
call, then a sleep to the end of ``STEP_S``. The faults are the same schedule in both arms:
at ``KILL_EVERY_S``, 2 x ``KILL_EVERY_S``, ... (before the window's end) after the arm's
first process started, a killer thread SIGKILLs one worker (ranks 1, 0, 1, ... in turn),
found in ``/proc`` as the newest live process carrying the arm's marker and that ``RANK`` in
its environment (torchrun's own process has no ``RANK``).

Goodput = kept steps x uninterrupted step time / window wall time, where

- the window runs from the arm's first process start to ``WINDOW_S`` later (start-up,
  restarts, lost and recomputed steps all count against it);
- kept steps = the newest step the job reached at the window's end and still holds: the
  last step logged before the window's end, when the attempt that logged it was still alive
  then (no kill since its first line); otherwise (the window ended while a killed attempt
  was being replaced) the step of the newest checkpoint on disk at the window's end, which
  is where the relaunch resumes;
- the uninterrupted step time = the median interval between consecutive steps logged by one
  attempt of the torchrun arm (the same work, no flashruntime): one unit for both arms, so
  a slower step of either arm costs it steps and is never credited back.

A fault-free job would score about 1 (all but its start-up). The row's ratio is ours /
torchrun's median goodput; its median and the comparator's are the absolute goodputs.
Restarts are the relaunches each arm made within the window (attempts whose script started,
less one); recovery is the time from a kill to the next step logged.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_rows
from benchmarks.scenarios._torchrun import torchrun_argv
from benchmarks.targets import GOODPUT_OVER_TORCHRUN

NAME, SECTION = "goodput_under_faults", "resilience"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_S, WINDOW_S, KILL_EVERY_S, EVERY = 0.2, 180.0, 30.0, 100
SMOKE_WINDOW_S, SMOKE_KILL_EVERY_S, SMOKE_EVERY = 20.0, 10.0, 20
MAX_RESTARTS = 50  # far more than the window's kills: the budget never ends a run here
MIN_SAMPLES = 3
MARKER_ENV = "GOODPUT_BENCH_MARKER"
METRICS = (("goodput", "fraction"), ("restarts", "restarts"), ("recovery_s", "s"), ("steps_kept", "steps"))
_STOP_S = 120  # a guard for each arm's wind-down, never a measurement

SCRIPT = textwrap.dedent("""
    import json, os, sys, time

    arm, step_s, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ.get("RANK", "0"))
    log_dir = os.environ["GOODPUT_LOG_DIR"]
    if arm == "ours":
        attempt = os.environ["FLASHML_ATTEMPT_ID"]
    else:
        attempt = "restart-" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if rank == 0:
        with open(os.path.join(log_dir, "starts.jsonl"), "a") as starts:
            starts.write(json.dumps({"attempt": attempt, "ts": time.time()}) + "\\n")

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if arm == "ours":
        import flashruntime.torch as ft

        model, optimizer = ft.prepare(model, optimizer)
        start = ft.start_step()
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        ckpt = os.environ["GOODPUT_CKPT"]
        start = 0
        if os.path.exists(ckpt):
            state = torch.load(ckpt, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"])
        model = DistributedDataParallel(model)
        metrics_path = os.path.join(log_dir, "metrics.jsonl")

    step = start
    while True:
        began = time.monotonic()
        x = torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if arm == "ours":
            ft.log_metrics({"step": step, "loss": loss.item()})
            ft.checkpoint(model, optimizer, step=step, every="auto", async_save=True)
        else:
            if rank == 0:
                with open(metrics_path, "a") as metrics:
                    metrics.write(json.dumps({"step": step, "loss": loss.item(), "ts": time.time(),
                                              "attempt": attempt}) + "\\n")
                if step % every == 0:
                    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                    torch.save(state, ckpt + ".tmp")
                    os.replace(ckpt + ".tmp", ckpt)
        time.sleep(max(0.0, step_s - (time.monotonic() - began)))
""")

DRIVER = textwrap.dedent("""
    import json, sys
    import flashruntime as flash
    from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
    workload = CommandWorkload(command=json.loads(sys.argv[1]), source=Source(path=sys.argv[2]),
                               outputs=OutputSpec(collect=[]))
    flash.submit(workload, output_dir=sys.argv[3], max_restarts=int(sys.argv[4]), watch=False, quiet=True)
""")


@dataclass
class Arm:
    """What one arm of one sample measured."""

    goodput: float = 0.0
    steps_kept: int = 0
    restarts: int = 0
    recovery_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)  # seconds after the start
    from_checkpoint: bool = False  # the window ended between a kill and the next step


def _env(marker: str, log_dir: Path, kill_every_s: float) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID",
            "FLASHML_OUTPUT_DIR", "FLASHML_CKPT_DIR", "TORCHELASTIC_RESTART_COUNT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({MARKER_ENV: marker, "GOODPUT_LOG_DIR": str(log_dir), "OMP_NUM_THREADS": "1",
                "FLASHML_CHECKPOINT_MTBF_S": f"{kill_every_s:g}", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))})
    return env


def _marked(marker: str) -> list[tuple[int, dict[str, str], int]]:
    """Live processes whose environment carries ``marker``: (pid, environment, start tick)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "environ").read_bytes()
            if needle not in raw:
                continue
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        found.append((int(entry.name), env, int(fields[19])))
    return found


def _kill_rank(marker: str, rank: int) -> bool:
    """SIGKILL the newest live worker of ``rank`` carrying ``marker``; whether one was found."""
    workers = [(tick, pid) for pid, env, tick in _marked(marker) if env.get("RANK") == str(rank)]
    if not workers:
        return False
    try:
        os.kill(max(workers)[1], signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _killer(marker: str, t0: float, schedule: list[float], stop: threading.Event, kills: list[float]) -> None:
    """At each offset of ``schedule`` after ``t0`` (monotonic), SIGKILL one worker, ranks 1, 0, 1, ...
    in turn; a kill due while no worker of that rank lives (a relaunch starting) waits for one."""
    for index, offset in enumerate(schedule):
        rank = 1 - index % 2
        while not stop.wait(max(0.0, t0 + offset - time.monotonic())):
            if _kill_rank(marker, rank):
                kills.append(time.monotonic() - t0)
                break
            offset = time.monotonic() - t0 + 0.05
        if stop.is_set():
            return


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written as the window closed
    return rows


def _score(lines: list[dict[str, Any]], starts: list[dict[str, Any]], wall0: float, window_s: float,
           kills: list[float], checkpoint_step: int, arm: Arm) -> None:
    """Fill ``arm``'s kept steps, restarts, recovery times and step intervals (goodput comes later)."""
    end = wall0 + window_s
    lines = sorted((line for line in lines if line["ts"] <= end), key=lambda line: line["ts"])
    arm.restarts = max(0, len({s["attempt"] for s in starts if s["ts"] <= end}) - 1)
    arm.kills = list(kills)
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_attempt.setdefault(line["attempt"], []).append(line)
    for rows in by_attempt.values():
        arm.step_s += [(b["ts"] - a["ts"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:])
                       if b["step"] > a["step"]]
    first_ts = {attempt: rows[0]["ts"] for attempt, rows in by_attempt.items()}
    for kill in kills:  # the first step of an attempt that started logging after the kill
        after = [line["ts"] for line in lines if first_ts[line["attempt"]] > wall0 + kill]
        if after:
            arm.recovery_s.append(after[0] - wall0 - kill)
    if not lines:
        arm.steps_kept = checkpoint_step
        arm.from_checkpoint = True
        return
    last = lines[-1]
    if any(first_ts[last["attempt"]] < wall0 + kill for kill in kills):
        arm.steps_kept, arm.from_checkpoint = checkpoint_step, True
    else:
        arm.steps_kept = int(last["step"])


def _schedule(window_s: float, kill_every_s: float) -> list[float]:
    offsets, at = [], kill_every_s
    while at < window_s - 1e-9:
        offsets.append(at)
        at += kill_every_s
    return offsets


def _pids_stop(marker: str) -> None:
    """SIGKILL whatever of an arm is still alive after its wind-down."""
    for pid, _, _ in _marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _watch_window(process: subprocess.Popen[bytes], marker: str, t0: float, window_s: float,
                  kill_every_s: float) -> list[float]:
    kills: list[float] = []
    stop = threading.Event()
    killer = threading.Thread(target=_killer, args=(marker, t0, _schedule(window_s, kill_every_s), stop, kills),
                              daemon=True)
    killer.start()
    while time.monotonic() < t0 + window_s:
        if process.poll() is not None:
            stop.set()
            raise RuntimeError(f"{NAME}: the job ended (exit {process.returncode}) inside the window")
        time.sleep(min(0.05, max(0.0, t0 + window_s - time.monotonic())))
    stop.set()
    killer.join()
    return kills


def _wind_down(process: subprocess.Popen[bytes], marker: str) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 10
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    _pids_stop(marker)


def _ours(work: Path, window_s: float, kill_every_s: float) -> Arm:
    from flashruntime.checkpoint.local import latest_valid_manifest

    log_dir, out, marker = work / "ours-log", work / "ours", uuid.uuid4().hex
    log_dir.mkdir()
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", "ours",
               str(STEP_S), "0"]
    wall0, t0 = time.time(), time.monotonic()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(command), str(work / "src"), str(out),
                               str(MAX_RESTARTS)], env=_env(marker, log_dir, kill_every_s),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kills = _watch_window(driver, marker, t0, window_s, kill_every_s)
        manifest = latest_valid_manifest(out / "local" / "ckpt")
        saved = 0 if manifest is None else manifest.step
        lines = []
        for metrics in (out / "local").glob("task-000*/metrics.jsonl"):
            lines += [{**line, "attempt": metrics.parent.name} for line in _read_jsonl(metrics)]
        starts = _read_jsonl(log_dir / "starts.jsonl")
    finally:
        _wind_down(driver, marker)
    arm = Arm()
    _score(lines, starts, wall0, window_s, kills, saved, arm)
    return arm


def _torchrun_arm(work: Path, window_s: float, kill_every_s: float, every: int) -> Arm:
    import torch

    log_dir, marker = work / "torchrun-log", uuid.uuid4().hex
    log_dir.mkdir()
    ckpt = work / "torchrun-ckpt.pt"
    env = {**_env(marker, log_dir, kill_every_s), "GOODPUT_CKPT": str(ckpt)}
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1",
               f"--max-restarts={MAX_RESTARTS}", "train.py", "torchrun", str(STEP_S), str(every)]
    wall0, t0 = time.time(), time.monotonic()
    with open(work / "torchrun.log", "wb") as log:
        process = subprocess.Popen(command, cwd=work / "src", env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        kills = _watch_window(process, marker, t0, window_s, kill_every_s)
        saved = int(torch.load(ckpt, weights_only=True)["step"]) if ckpt.exists() else 0
        lines = _read_jsonl(log_dir / "metrics.jsonl")
        starts = _read_jsonl(log_dir / "starts.jsonl")
    finally:
        _wind_down(process, marker)
    arm = Arm()
    _score(lines, starts, wall0, window_s, kills, saved, arm)
    return arm


def _cadence_words(work: Path) -> str:
    """The Young/Daly interval ours settled on, from the steps its checkpoints were written at."""
    steps = sorted(int(p.name.removeprefix("step-")) for p in (work / "ours" / "local" / "ckpt").glob("step-*")
                   if p.name.removeprefix("step-").isdigit())
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    return f"every {statistics.median(gaps):g} steps (median)" if gaps else "not seen"


def run(repeats: int, smoke: bool) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return skipped_rows(NAME, SECTION, METRICS, "needs torch (a 2-rank gloo job)")
    samples = 1 if smoke else max(MIN_SAMPLES, repeats)
    window, kill_every, every = ((SMOKE_WINDOW_S, SMOKE_KILL_EVERY_S, SMOKE_EVERY) if smoke
                                 else (WINDOW_S, KILL_EVERY_S, EVERY))
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    pairs: list[tuple[Arm, Arm]] = []
    cadences: list[str] = []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            work = Path(tmp)
            (work / "src").mkdir()
            (work / "src" / "train.py").write_text(SCRIPT)
            ours = _ours(work, window, kill_every)
            cadences.append(_cadence_words(work))
            plain = _torchrun_arm(work, window, kill_every, every)
        unit = statistics.median(plain.step_s) if plain.step_s else STEP_S
        for arm in (ours, plain):
            arm.goodput = arm.steps_kept * unit / window
        pairs.append((ours, plain))
    ours_arms, plain_arms = [p[0] for p in pairs], [p[1] for p in pairs]

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "—"

    setup = (f"2 ranks (torchrun, gloo, CPU), steps padded to {STEP_S:g} s, one rank SIGKILLed every "
             f"{kill_every:g} s (ranks 1, 0, 1, ...) over a {window:g} s window from the arm's first process, "
             f"the arms one after the other; ours: flash.submit(max_restarts={MAX_RESTARTS}), ft.checkpoint("
             f"every='auto', async_save=True), FLASHML_CHECKPOINT_MTBF_S={kill_every:g}, saves seen "
             f"{'; '.join(cadences)}; torchrun: --max-restarts={MAX_RESTARTS}, torch.save every {every} steps, "
             f"loaded at start")
    definition = ("goodput = kept steps x the torchrun arm's median uninterrupted step time / window: kept steps "
                  "= the last step logged before the window's end by a live attempt, else the newest checkpoint "
                  f"then (taken from the checkpoint in {sum(a.from_checkpoint for a in ours_arms)} of {samples} "
                  f"ours, {sum(a.from_checkpoint for a in plain_arms)} of {samples} torchrun)")
    paces = (f"median step time: ours {med([s for a in ours_arms for s in a.step_s])} s, torchrun "
             f"{med([s for a in plain_arms for s in a.step_s])} s; kills per sample: ours "
             f"{[len(a.kills) for a in ours_arms]}, torchrun {[len(a.kills) for a in plain_arms]}")
    recovery = (f"recovery = from a kill to the next step logged (the relaunch: torchrun's start, torch's import, "
                f"the process group, the restore); median ours {med([s for a in ours_arms for s in a.recovery_s])} "
                f"s, torchrun {med([s for a in plain_arms for s in a.recovery_s])} s")
    comparator = f"torchrun --max-restarts, torch.save every {every} steps"
    return [
        measured_row(NAME, SECTION, "goodput", "fraction", [a.goodput for a in ours_arms],
                     comparator=(comparator, [a.goodput for a in plain_arms]), target=GOODPUT_OVER_TORCHRUN,
                     notes=[setup, definition, paces]),
        measured_row(NAME, SECTION, "steps_kept", "steps", [float(a.steps_kept) for a in ours_arms],
                     comparator=(comparator, [float(a.steps_kept) for a in plain_arms])),
        measured_row(NAME, SECTION, "restarts", "restarts", [float(a.restarts) for a in ours_arms],
                     comparator=(comparator, [float(a.restarts) for a in plain_arms]),
                     notes=["relaunches within the window: attempts whose script started, less the first"]),
        measured_row(NAME, SECTION, "recovery_s", "s",
                     [statistics.median(a.recovery_s) if a.recovery_s else window for a in ours_arms],
                     comparator=(comparator,
                                 [statistics.median(a.recovery_s) if a.recovery_s else window for a in plain_arms]),
                     notes=[recovery + "; one sample per pair: the median of its kills"]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a job losing a rank every 30 s keeps at least 1.1x the progress plain torchrun --max-restarts "
               "keeps: asynchronous saves at the Young/Daly interval lose a step or two per fault, not the steps "
               "since a fixed periodic checkpoint; the slower relaunch gives part of that back",
    section=SECTION,
    run=run,
)
