"""hang_mttd: a rank of a 2-rank gloo job hangs forever; how long until it is noticed.

The script (flashruntime.torch heartbeats, log_metrics, ft.checkpoint every 4 steps, one
``STEP_S`` second step after another) puts rank 1 to sleep forever at step ``HANG_AT`` of its
first attempt, writing the wall time it did so first. Ours: ``flash.submit`` of it under
torchrun with ``hang_timeout_s = 3 x STEP_S`` (the benchmark sets the timeout from the known
step time; the default rule, ``max(10 x median step, 60 s)``, is for runs whose step time
nobody told it); MTTD = the ``HANG_DETECTED`` event's time − the hang's. The relaunch must
end the run SUCCEEDED. The comparator: the same command under plain ``torchrun
--max-restarts=1``, watched for ``CAP_S`` seconds for any sign it noticed (its exit, or a
restarted worker); it never does (gloo waits 30 minutes by default), so its figure is the cap,
a lower bound, and the ratio an upper bound.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_rows
from benchmarks.scenarios._torchrun import torchrun_argv
from benchmarks.targets import HANG_MTTD_S

NAME, SECTION = "hang_mttd", "resilience"
STEP_S, STEPS, HANG_AT, EVERY = 1.0, 12, 6, 4
TIMEOUT_S = 3 * STEP_S
CAP_S, SMOKE_CAP_S = 120.0, 10.0
METRICS = (("mttd_s", "s"), ("hung_s", "s"))

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft

    steps, hang_at, every, step_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    out = os.environ["FLASHML_OUTPUT_DIR"]
    first = (os.environ.get("FLASHML_ATTEMPT_ID", "task-000") == "task-000"
             and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0")
    if not first and ft.rank() == 0:
        open(os.path.join(out, f"relaunched-{os.getpid()}"), "w").close()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, optimizer = ft.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    for step in range(ft.start_step(), steps):
        started = time.monotonic()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if first and ft.rank() == 1 and step + 1 == hang_at:
            with open(os.path.join(out, "hang-started.json"), "w") as marker:
                json.dump({"ts": time.time()}, marker)
            time.sleep(10 ** 6)
        ft.log_metrics({"step": step + 1, "loss": loss.item()})
        ft.checkpoint(model, optimizer, step=step + 1, every=every)
        time.sleep(max(0.0, step_s - (time.monotonic() - started)))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
""")


def _args() -> list[str]:
    return [str(STEPS), str(HANG_AT), str(EVERY), str(STEP_S)]


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}


def _ours(work: Path) -> tuple[float, float, str, float | None]:
    """(MTTD, hung seconds in the ledger, final state, median step time) of one hang under flash.submit."""
    from flashruntime.sdk import submit
    from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

    (work / "src").mkdir(parents=True)
    (work / "src" / "train.py").write_text(SCRIPT)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", *_args()]
    workload = CommandWorkload(command=command, source=Source(path=str(work / "src")), env=_env(),
                               outputs=OutputSpec(collect=[]))
    run = submit(workload, output_dir=work / "out", max_restarts=1, watch=False, quiet=True, hang_timeout_s=TIMEOUT_S)
    hang_started = json.loads((work / "out" / "local" / "task-000" / "hang-started.json").read_text())["ts"]
    detected = next(e["ts"] for e in run.events if e["type"] == "HANG_DETECTED")
    failure = run.attempts[0].get("failure") or {}
    median = (failure.get("hang") or {}).get("median_step_s")
    return detected - hang_started, run.goodput().hung_s, str(run.state), median


def _torchrun_alone(work: Path, cap_s: float) -> float | None:
    """Seconds until plain torchrun noticed the hang (exited, or restarted its workers); None within the cap."""
    work.mkdir(parents=True)
    (work / "train.py").write_text(SCRIPT)
    out = work / "out"
    out.mkdir()
    env = {**os.environ, **_env(), "FLASHML_OUTPUT_DIR": str(out), "FLASHML_CKPT_DIR": str(work / "ckpt")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FLASHML_ATTEMPT_ID"):
        env.pop(name, None)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "--max-restarts=1",
               "train.py", *_args()]
    with open(work / "torchrun.log", "wb") as log:
        process = subprocess.Popen(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    noticed = None
    try:
        marker = out / "hang-started.json"
        deadline = time.monotonic() + cap_s + 120  # the hang itself must first come
        while time.monotonic() < deadline and not marker.exists() and process.poll() is None:
            time.sleep(0.1)
        started = json.loads(marker.read_text())["ts"] if marker.exists() else time.time()
        while time.time() - started < cap_s:
            if process.poll() is not None or any(out.glob("relaunched-*")):
                noticed = time.time() - started
                break
            time.sleep(0.2)
    finally:
        _stop(process, out)
    return noticed


def _stop(process: subprocess.Popen[bytes], out: Path) -> None:
    """torchrun, then every rank it started (each in a session of its own), by the heartbeats' pids."""
    pids = []
    for beat in (out / "ranks").glob("rank-*.json"):
        try:
            pids.append(int(json.loads(beat.read_text())["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for pid in [process.pid, *pids]:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, signum)
            except OSError:
                break
    process.wait()


def run(repeats: int, smoke: bool) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return skipped_rows(NAME, SECTION, METRICS, "needs torch (a 2-rank gloo job)")
    samples = 1 if smoke else max(3, repeats)
    cap = SMOKE_CAP_S if smoke else CAP_S
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    mttd, hung, states, medians = [], [], set(), []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            seconds, hung_s, state, median = _ours(Path(tmp))
            mttd.append(seconds)
            hung.append(hung_s)
            states.add(state)
            if median is not None:
                medians.append(median)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        noticed = _torchrun_alone(Path(tmp) / "torchrun", cap)
    comparator = noticed if noticed is not None else cap
    seen = (f"plain torchrun --max-restarts=1 noticed the hang after {noticed:.1f} s" if noticed is not None else
            f"plain torchrun --max-restarts=1 had not noticed the hang after {cap:g} s: its figure is the cap "
            f"(> {cap:g} s), a lower bound, so the ratio is an upper bound")
    step = f"median step {statistics.median(medians):.3f} s as the watch measured it" if medians else "no step timed"
    setup = (f"2 ranks (gloo), {STEPS} steps of {STEP_S:g} s, checkpoint every {EVERY}, rank 1 hangs forever at "
             f"step {HANG_AT}; hang_timeout_s = {TIMEOUT_S:g} (3 step times, set by the benchmark); {step}; "
             f"final states {sorted(states)}")
    notes = [setup, seen]
    return [
        measured_row(NAME, SECTION, "mttd_s", "s", mttd, comparator=("torchrun --max-restarts=1 alone", [comparator]),
                     target=HANG_MTTD_S, notes=notes),
        measured_row(NAME, SECTION, "hung_s", "s", hung,
                     notes=["the goodput ledger's hung time: from the last progress the watch saw to the detection"]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a rank that hangs forever is caught in seconds, its stacks dumped and the group relaunched, where "
               "torchrun alone waits on the collective indefinitely",
    section=SECTION,
    run=run,
)
