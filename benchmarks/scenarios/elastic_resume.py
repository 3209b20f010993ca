"""elastic_resume: a rank of a 2-rank gloo job is lost for good at step ``LOSE_AT``; the seconds
from the loss to the first step completed by the ranks left.

The script (flashruntime.torch: ``ft.prepare``, ``ft.log_metrics`` with the world size,
``ft.checkpoint`` every ``EVERY`` steps, steps padded to ``STEP_S``) writes one line per step
and rank, with the wall time, to ``steps-rank<R>.jsonl`` in its output directory.

- Ours: ``flash.submit`` of it under ``torchrun --nproc-per-node=2`` with ``ranks=(1, 2)`` and
  chaos ``lose_rank`` of rank 1 at ``LOSE_AT``: the rank is SIGKILLed and its slot withdrawn
  for the rest of the run, so the relaunch runs 1 rank from the newest checkpoint. Figure =
  the first ``metrics.jsonl`` record of the relaunched attempt − the ``CHAOS_INJECTED`` event.
  Steps lost = the newest step the first attempt logged − the step the relaunch resumed from.
- The comparator: two torchrun agents on this host (``--nnodes=2 --nproc-per-node=1``, c10d
  rendezvous, ``--max-restarts=3``), the same script; when the second node's rank logs
  ``LOSE_AT``, that agent and its rank are SIGKILLed and never come back. The surviving agent
  restarts its worker into a new rendezvous, which waits for a second node (by default for
  10 minutes); it is watched for ``CAP_S`` seconds for a step after the loss. When none
  comes, its figure is the cap, a lower bound, and the ratio an upper bound.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_rows
from benchmarks.scenarios._torchrun import torchrun_argv
from benchmarks.targets import ELASTIC_RESUME_S

NAME, SECTION = "elastic_resume", "resilience"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_S, EVERY = 0.25, 4
TOTAL, LOSE_AT, CAP_S = 30, 14, 120.0
SMOKE_TOTAL, SMOKE_LOSE_AT, SMOKE_CAP_S = 12, 6, 15.0
METRICS = (("resume_s", "s"), ("steps_lost", "steps"))
RECOMPUTED_NOTE = ("steps the relaunch recomputed: the newest step the 2-rank attempt logged less the checkpoint "
                   "step the 1-rank attempt resumed from")
_WAIT_S = 300  # a hang guard for reaching the loss, never a measurement
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID")

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import flashruntime.torch as ft

    total, every, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = ft.prepare(model, optimizer)
    out = os.environ["FLASHML_OUTPUT_DIR"]
    progress = open(os.path.join(out, f"steps-rank{ft.rank()}.jsonl"), "a")
    for step in range(ft.start_step(), total):
        started = time.monotonic()
        x = torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ft.log_metrics({"step": step + 1, "loss": loss.item(), "world_size": ft.world_size()})
        progress.write(json.dumps({"step": step + 1, "ts": time.time(), "pid": os.getpid(),
                                   "world_size": ft.world_size()}) + "\\n")
        progress.flush()
        ft.checkpoint(model, optimizer, step=step + 1, every=every)
        time.sleep(max(0.0, step_s - (time.monotonic() - started)))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


def _records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return records


def _ours(work: Path, total: int, lose_at: int) -> tuple[float, int, list[int], str, tuple[float, float, float]]:
    """(seconds from the loss to the first step at the smaller size, steps recomputed, the world
    size of each attempt, the final state, and the seconds split into the 2-rank attempt's end,
    the relaunch's start and its first step) of one lost rank under flash.submit."""
    from flashruntime.local.chaos import ChaosPlan, Fault
    from flashruntime.sdk import submit
    from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

    (work / "src").mkdir(parents=True)
    (work / "src" / "train.py").write_text(SCRIPT)
    command = [*torchrun_argv(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", "train.py", str(total),
               str(EVERY), str(STEP_S)]
    workload = CommandWorkload(command=command, source=Source(path=str(work / "src")),
                               env={"PYTHONPATH": _pythonpath(), "OMP_NUM_THREADS": "1"},
                               outputs=OutputSpec(collect=[]))
    chaos = ChaosPlan(faults=[Fault(kind="lose_rank", rank=1, at_step=lose_at)])
    run = submit(workload, output_dir=work / "out", max_restarts=2, watch=False, quiet=True, chaos=chaos,
                 ranks=(1, 2))
    sizes = [int(attempt["world_size"]) for attempt in run.attempts]
    lost = [e["ts"] for e in run.events if e["type"] == "CHAOS_INJECTED" and "lose_rank" in e["message"]]
    if len(run.attempts) < 2 or sizes[1] != 1 or not lost:
        raise RuntimeError(f"elastic_resume: expected a relaunch at 1 rank after the lose_rank, got world sizes "
                           f"{sizes} and events {[e['type'] for e in run.events]}; {run.logs(40)}")
    before = _records(Path(run.attempts[0]["output_dir"]) / "metrics.jsonl")
    after = _records(Path(run.attempts[1]["output_dir"]) / "metrics.jsonl")
    if not before or not after:
        raise RuntimeError(f"elastic_resume: an attempt logged no step (before the loss {len(before)}, after "
                           f"{len(after)}); {run.logs(40)}")
    recomputed = max(r["step"] for r in before) - (after[0]["step"] - 1)
    ended, relaunched = float(run.attempts[0]["finished_at"]), float(run.attempts[1]["started_at"])
    phases = (ended - lost[0], relaunched - ended, after[0]["ts"] - relaunched)
    return after[0]["ts"] - lost[0], recomputed, sizes, str(run.state), phases


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def _agent_state(log: str, code: int | None, waited_s: float) -> str:
    """What the surviving agent was doing at the end, from its own INFO log."""
    if code is not None:
        return f"the surviving agent exited with code {code} {waited_s:.0f} s after the loss"
    restarted = log.rfind("will restart worker group")
    waiting = log.rfind("Rendezvous'ing worker group")
    joined = log.rfind("Rendezvous complete")
    if restarted >= 0 and waiting > restarted and joined < waiting:
        return (f"{waited_s:.0f} s after the loss the surviving agent had restarted its worker group and was still "
                f"in the rendezvous, waiting for a second node")
    return f"the surviving agent was still running {waited_s:.0f} s after the loss, not in a new rendezvous"


def _torchrun_two_nodes(work: Path, total: int, lose_at: int, cap_s: float) -> tuple[float | None, str]:
    """(seconds from the loss to the survivor's next step, None within the cap; what the
    surviving agent was doing at the end) under two plain torchrun agents."""
    work.mkdir(parents=True)
    (work / "train.py").write_text(SCRIPT)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV}
    env.update(PYTHONPATH=_pythonpath(), OMP_NUM_THREADS="1", FLASHML_CKPT_DIR=str(work / "ckpt"), LOGLEVEL="INFO")
    agents: list[subprocess.Popen[bytes]] = []
    outs = [work / f"node{node}" for node in (0, 1)]
    try:
        for node, out in enumerate(outs):
            out.mkdir()
            argv = [*torchrun_argv(), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=elastic-{port}", "--max-restarts=3",
                    "--local-addr=127.0.0.1", str(work / "train.py"), str(total), str(EVERY), str(STEP_S)]
            with open(work / f"node{node}.log", "wb") as log:
                agents.append(subprocess.Popen(argv, cwd=work, env={**env, "FLASHML_OUTPUT_DIR": str(out)},
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + _WAIT_S
            while node == 0 and not _listening(port):  # node 0 hosts the rendezvous store; node 1 is the one lost
                if time.monotonic() > deadline or agents[0].poll() is not None:
                    raise RuntimeError(f"elastic_resume: the first torchrun agent never served its rendezvous; "
                                       f"{(work / 'node0.log').read_text()[-2000:]}")
                time.sleep(0.05)
        deadline = time.monotonic() + _WAIT_S
        while True:
            lost_node = [r for path in outs[1].glob("steps-rank*.jsonl") for r in _records(path)]
            if any(r["step"] >= lose_at for r in lost_node):
                break
            if time.monotonic() > deadline or any(agent.poll() is not None for agent in agents):
                raise RuntimeError(f"elastic_resume: torchrun's second node never reached step {lose_at}; "
                                   f"{(work / 'node1.log').read_text()[-2000:]}")
            time.sleep(0.02)
        _kill([agents[1].pid, *{int(r["pid"]) for r in lost_node}])
        lost = time.time()
        recovered = None
        while time.time() - lost < cap_s:
            later = [r for path in outs[0].glob("steps-rank*.jsonl") for r in _records(path) if r["ts"] > lost]
            if later:
                recovered = min(r["ts"] for r in later) - lost
                break
            if agents[0].poll() is not None:
                break
            time.sleep(0.2)
        code = agents[0].poll()
        waited = time.time() - lost
        return recovered, _agent_state((work / "node0.log").read_text(errors="replace"), code, waited)
    finally:
        survivors = [int(r["pid"]) for path in outs[0].glob("steps-rank*.jsonl") for r in _records(path)]
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        _kill(sorted(set(survivors)))


def run(repeats: int, smoke: bool) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return skipped_rows(NAME, SECTION, METRICS, "needs torch (a 2-rank gloo job)")
    samples = 1 if smoke else max(3, repeats)
    total, lose_at, cap = (SMOKE_TOTAL, SMOKE_LOSE_AT, SMOKE_CAP_S) if smoke else (TOTAL, LOSE_AT, CAP_S)
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    resume, lost, sizes, states, phases = [], [], set(), set(), []
    for _ in range(samples):
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            seconds, recomputed, world_sizes, state, split = _ours(Path(tmp), total, lose_at)
            phases.append(split)
            resume.append(seconds)
            lost.append(float(recomputed))
            sizes.add(tuple(world_sizes))
            states.add(state)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        recovered, doing = _torchrun_two_nodes(Path(tmp) / "torchrun", total, lose_at, cap)
    comparator = recovered if recovered is not None else cap
    seen = (f"torchrun's surviving node took its next step {recovered:.1f} s after the loss" if recovered is not None
            else f"torchrun's surviving node took no step within {cap:g} s of the loss ({doing}): its figure is "
                 f"the cap (> {cap:g} s), a lower bound, so the ratio is an upper bound")
    setup = (f"2 ranks (gloo), {total} steps of {STEP_S:g} s, checkpoint every {EVERY}, rank 1 lost for good at "
             f"step {lose_at}; ours: flash.submit of torchrun --nproc-per-node=2 with ranks=(1, 2), chaos lose_rank, "
             f"max_restarts=2; world sizes per attempt {sorted(sizes)}; final states {sorted(states)}")
    ended, relaunched, first = (statistics.median(phase) for phase in zip(*phases))
    split = (f"of ours, medians: {ended:.2f} s until the 2-rank attempt ended (torchrun noticing the lost rank and "
             f"stopping the other), {relaunched:.2f} s to the relaunch, {first:.2f} s from the relaunch to its first "
             f"step (a new torchrun, imports, the restore of the checkpoint, the step)")
    comparator_name = "torchrun --nnodes=2 --max-restarts=3, a node lost for good"
    return [
        measured_row(NAME, SECTION, "resume_s", "s", resume, comparator=(comparator_name, [comparator]),
                     target=ELASTIC_RESUME_S, notes=[setup, seen, split]),
        measured_row(NAME, SECTION, "steps_lost", "steps", lost,
                     notes=[RECOMPUTED_NOTE]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a rank lost for good costs a relaunch on the ranks left, seconds from the loss to the next step, "
               "where torchrun with a fixed node count waits in its rendezvous for a node that never returns",
    section=SECTION,
    run=run,
)
