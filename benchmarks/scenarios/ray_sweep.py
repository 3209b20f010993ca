"""ray_sweep: one 16-trial sweep of light trials (each sleeps, then writes metrics.json), run
three ways side by side, each already warm so that only the sweep is timed:

- ``ray``: a ``ray`` job on ``flashruntime serve --ray-address local`` (the coordinator's
  embedded single-node Ray of 2 CPUs), from the POST to SUCCEEDED;
- ``fleet``: the same job as a ``leases`` job on the same coordinator, run by two
  ``flashruntime worker`` processes already polling, from the POST to SUCCEEDED;
- ``local`` (the comparator): ``flash.submit(..., max_concurrent_trials=2)`` in a fresh
  process, timing the call alone.

All three run two trials at a time on this 2-core host. The rounds rotate the order of the
three. The ratios to ``local`` show what the coordinator, its transactions and the way each
backend hands out tasks (Ray's scheduler and object store, the agents' claims) cost per trial.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_rows
from benchmarks.scenarios._coordinator_http import (
    http_client,
    make_work_dir,
    service_missing,
    serving,
    subprocess_env,
)
from benchmarks.targets import FLEET_SWEEP_OVER_LOCAL, RAY_SWEEP_OVER_LOCAL

NAME, SECTION = "ray_sweep", "performance"
TRIALS = 16
FULL_TRIAL_S, SMOKE_TRIAL_S = 1.0, 0.1
MIN_ROUNDS = 3
METRICS = (("ray_backend_vs_local", "s"), ("agent_fleet_vs_local", "s"))
POOL = "bench"

TRIAL = ("import json, os, sys, time; time.sleep(float(sys.argv[2])); "
         "json.dump(dict(score=float(sys.argv[1])), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], "
         "'metrics.json'), 'w'))")

LOCAL_SWEEP = """
import json, sys, time
import flashruntime as flash
from flashruntime.workloads.command import CommandWorkload, Source
trial, seconds, trials, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
workload = CommandWorkload(command=[sys.executable, "-c", trial, "{score}", seconds], source=Source(path="."),
                           task_params=[{"score": n} for n in range(trials)])
started = time.perf_counter()
run = flash.submit(workload, output_dir=out, max_concurrent_trials=2, quiet=True, watch=False)
elapsed = time.perf_counter() - started
assert str(run.state) == "SUCCEEDED", run.state
print(json.dumps(elapsed))
"""


def _job(backend: str, trial_s: float) -> dict[str, Any]:
    spec: dict[str, Any] = {"execution": {"backend": backend},
                            "workload": {"type": "command", "parameters": {
                                "command": [sys.executable, "-c", TRIAL, "{score}", str(trial_s)],
                                "task_params": [{"score": n} for n in range(TRIALS)]}}}
    if backend == "leases":  # agents run commands for a pool they serve, unsandboxed by the job's leave
        spec.update(isolation={"tier": "sandboxed", "allowFallback": True}, placement={"pool": POOL})
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": f"sweep-{backend}"},
            "spec": spec}


def _sweep_on(client: Any, backend: str, trial_s: float) -> float:
    started = time.perf_counter()
    response = client.post("/v1alpha1/jobs", json=_job(backend, trial_s))
    if response.status_code != 201:
        raise RuntimeError(f"{backend} job refused: {response.status_code} {response.text}")
    job_id = response.json()["job_id"]
    deadline = time.monotonic() + 300  # a hang guard
    while (state := client.get(f"/v1alpha1/jobs/{job_id}").json()["state"]) in ("PENDING", "RUNNING"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {backend} sweep did not end within 300 s: "
                               f"{client.get(f'/v1alpha1/jobs/{job_id}/tasks').text[:2000]}")
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    if state != "SUCCEEDED":
        raise RuntimeError(f"the {backend} sweep ended {state}: {client.get(f'/v1alpha1/jobs/{job_id}/events').text}")
    return elapsed


def _sweep_locally(work: Path, index: int, trial_s: float) -> float:
    done = subprocess.run([sys.executable, "-c", LOCAL_SWEEP, TRIAL, str(trial_s), str(TRIALS),
                           str(work / f"local-{index}")], env=subprocess_env(), cwd=work, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the local sweep exited {done.returncode}: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def run(repeats: int, smoke: bool) -> list[dict]:
    missing = service_missing() or (None if importlib.util.find_spec("ray") else
                                    "Ray is not installed: pip install 'flashruntime[ray]'")
    if missing:
        return skipped_rows(NAME, SECTION, METRICS, missing)
    rounds = 1 if smoke else max(MIN_ROUNDS, repeats)
    trial_s = SMOKE_TRIAL_S if smoke else FULL_TRIAL_S
    work = make_work_dir(NAME)
    times: dict[str, list[float]] = {"ray": [], "leases": [], "local": []}
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with serving(work / "data", ray_address="local", env={"FLASHML_ALLOW_UNSANDBOXED_ARGV": "1"}) as server:
            for n in range(2):
                log = open(work / f"worker-{n}.log", "wb")
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "flashruntime.cli", "--api", server.url, "worker", "--runner", "trusted",
                     "--node-id", f"bench-{n}", "--pools", POOL, "--work-dir", str(work / f"agent-{n}"),
                     "--poll-seconds", "0.2"],
                    env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
                log.close()
            with http_client(server.url) as client:
                _sweep_on(client, "ray", SMOKE_TRIAL_S)  # warm: Ray's workers started, the agents registered
                _sweep_on(client, "leases", SMOKE_TRIAL_S)
                for index in range(rounds):
                    order = ("local", "ray", "leases")
                    for kind in order[index % 3:] + order[:index % 3]:
                        times[kind].append(_sweep_locally(work, index, trial_s) if kind == "local"
                                           else _sweep_on(client, kind, trial_s))
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        shutil.rmtree(work, ignore_errors=True)
    floor = TRIALS * trial_s / 2
    notes = [f"{rounds} rounds, the order of the three rotated each round; {TRIALS} trials of {trial_s} s of sleep, "
             f"two at a time in each (the floor: {floor:g} s)",
             f"medians: ray {statistics.median(times['ray']):.2f} s, fleet {statistics.median(times['leases']):.2f} s, "
             f"local {statistics.median(times['local']):.2f} s"]
    return [
        measured_row(NAME, SECTION, "ray_backend_vs_local", "s", times["ray"],
                     comparator=("flash.submit, 2 at a time", times["local"]), target=RAY_SWEEP_OVER_LOCAL,
                     notes=notes),
        measured_row(NAME, SECTION, "agent_fleet_vs_local", "s", times["leases"],
                     comparator=("flash.submit, 2 at a time", times["local"]), target=FLEET_SWEEP_OVER_LOCAL,
                     notes=notes),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="a 16-trial sweep of light trials on the Ray backend, and on a fleet of two agents, takes at most "
               "1.15x the wall time of flash.submit running two at a time",
    section=SECTION,
    run=run,
)
