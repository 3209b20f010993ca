"""``lease_mttd_mttr``: a worker SIGKILLed while holding a lease on a real
coordinator on loopback; how long until the coordinator notices, and until the task's
output is committed by someone else.

One ``flashruntime serve`` subprocess on 127.0.0.1 for the run (data under
``benchmarks/.work``) with the sweep interval set to ``SWEEP_INTERVAL_S`` through
``FLASHML_SWEEP_INTERVAL_S``. Per kill: a fresh one-task ``hyperparameter_search`` job with
``lease_seconds = LEASE_SECONDS``; a worker subprocess (``_VICTIM`` below: register,
claim, heartbeat every ``HEARTBEAT_S``) is SIGKILLed right after its
``HEARTBEATS_BEFORE_KILL``-th heartbeat answer. A rescuer client, registered beforehand,
polls the job's events route (reads never sweep) until LEASE_EXPIRED names the dead
lease, then claims the requeued task, uploads its ``metrics.json`` and completes it.

- MTTD = LEASE_EXPIRED's timestamp − the kill's wall-clock time. Bound: the lease
  expires ``lease_seconds`` after the last renewal and the background sweep notices
  within ``sweep_interval_s``, so MTTD <= ``lease_seconds + sweep_interval_s``; samples
  over it are counted and flagged in the notes.
- MTTR = the rescuer's commit answered ``accepted: true`` − LEASE_EXPIRED's timestamp
  (includes its event-poll delay, <= ``EVENT_POLL_S``).
- Round trips from the clients (perf_counter): claims (victim and rescuer), lease
  heartbeats (victim), pooled over the kills.

No comparator, no target.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.host import filesystem_type
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, quantile, skipped_row, skipped_rows
from benchmarks.scenarios import _coordinator_http as http

NAME = "lease_mttd_mttr"
SECTION = "resilience"
LEASE_SECONDS = 2.0
SWEEP_INTERVAL_S = 0.5
HEARTBEAT_S = 0.5
HEARTBEATS_BEFORE_KILL = 3
EVENT_POLL_S = 0.05
MIN_KILLS = 5
JOB_NAME = "lease-mttd-mttr"  # a DNS-1123 label, as JobSpec requires
BOUND_S = LEASE_SECONDS + SWEEP_INTERVAL_S
METRICS = (
    ("mttd_s", "s"), ("mttr_s", "s"), ("sweep_lag_after_deadline_s", "s"),
    ("leases_recovered", "per kill"), ("claim_rtt_ms", "ms"), ("heartbeat_rtt_ms", "ms"),
)

# The worker that gets killed: standard library + httpx, one JSON line per step on stdout.
_VICTIM = """\
import json, sys, time
import httpx
url, node_id, job_id, interval = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def say(**fields):
    print(json.dumps(fields), flush=True)
registration = {"node_id": node_id, "kubernetes_node": "", "hostname": node_id + ".bench", "module_capable": True,
                "capabilities": {"cpu_cores": 1, "pools": []}}
with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as client:
    answer = client.post("/v1alpha1/nodes/register", json=registration)
    if answer.status_code != 200:
        say(event="error", step="register", status=answer.status_code, body=answer.text)
        sys.exit(1)
    start = time.perf_counter()
    answer = client.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": job_id})
    rtt_ms = (time.perf_counter() - start) * 1000.0
    if answer.status_code != 200:
        say(event="error", step="claim", status=answer.status_code, body=answer.text)
        sys.exit(1)
    lease = answer.json()
    lease_id = lease["lease_id"]
    say(event="claimed", lease_id=lease_id, task_id=lease["task_id"], deadline=lease["deadline"], rtt_ms=rtt_ms)
    while True:  # "working" until killed
        time.sleep(interval)
        start = time.perf_counter()
        answer = client.post(f"/v1alpha1/attempts/{lease_id}/heartbeat")
        rtt_ms = (time.perf_counter() - start) * 1000.0
        if answer.status_code != 200:
            say(event="error", step="heartbeat", status=answer.status_code, body=answer.text)
            sys.exit(1)
        say(event="heartbeat", deadline=answer.json()["deadline"], rtt_ms=rtt_ms)
"""


class _Victim:
    """The worker subprocess and a reader thread turning its stdout lines into a queue."""

    def __init__(self, url: str, node_id: str, job_id: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _VICTIM, url, node_id, job_id, repr(HEARTBEAT_S)],
            env=http.subprocess_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, name=f"{NAME}-victim-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def next_step(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next JSON step the worker reported; raises if it died or said something else."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the worker reported nothing for {timeout_s} s: {''.join(self.output)[-2000:]}")
            if line is None:
                raise RuntimeError(f"the worker exited early: {''.join(self.output)[-2000:]}")
            try:
                step = json.loads(line)
            except ValueError:
                continue  # not one of its JSON lines (a warning, say); kept in self.output
            if step.get("event") == "error":
                raise RuntimeError(f"the worker failed: {step}")
            return dict(step)

    def kill(self) -> float:
        """SIGKILL now; → the kill's wall-clock time (epoch seconds)."""
        killed_at = time.time()
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        return killed_at

    def reap(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _wait_for_expiry(client: Any, job_id: str, lease_id: str, timeout_s: float) -> dict[str, Any] | None:
    """The LEASE_EXPIRED event of ``lease_id``, polled from the events route; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in client.get(f"/v1alpha1/jobs/{job_id}/events").json():
            if event["type"] == "LEASE_EXPIRED" and (event.get("data") or {}).get("lease_id") == lease_id:
                return dict(event)
        time.sleep(EVENT_POLL_S)
    return None


def _one_kill(url: str, rescuer: Any, index: int) -> dict[str, Any]:
    """Kill one lease holder and recover its task; → what was measured (``recovered`` False
    with a ``why`` when the lease was not re-claimed and committed)."""
    job_id = http.submit(rescuer, http.job_spec(1, LEASE_SECONDS, name=JOB_NAME))
    victim = _Victim(url, f"victim-{index}", job_id)
    claim_rtts: list[float] = []
    heartbeat_rtts: list[float] = []
    try:
        claimed = victim.next_step()
        if claimed.get("event") != "claimed":
            raise RuntimeError(f"expected the worker's claim, got {claimed}")
        claim_rtts.append(float(claimed["rtt_ms"]))
        lease_id, last_deadline = claimed["lease_id"], claimed["deadline"]
        for _ in range(HEARTBEATS_BEFORE_KILL):
            beat = victim.next_step()
            heartbeat_rtts.append(float(beat["rtt_ms"]))
            last_deadline = beat["deadline"]
        killed_at = victim.kill()
    finally:
        victim.reap()
    result: dict[str, Any] = {"claim_rtts": claim_rtts, "heartbeat_rtts": heartbeat_rtts, "recovered": False}
    expired = _wait_for_expiry(rescuer, job_id, lease_id, timeout_s=BOUND_S + 30.0)
    if expired is None:
        result["why"] = f"no LEASE_EXPIRED for {lease_id} within {BOUND_S + 30.0:g} s of the kill"
        return result
    expired_at = http.parse_timestamp(expired["timestamp"])
    result["mttd_s"] = expired_at - killed_at
    result["sweep_lag_s"] = expired_at - http.parse_timestamp(last_deadline)

    start = time.perf_counter()
    answer = rescuer.post("/v1alpha1/leases/claim", json={"node_id": "rescuer", "job_id": job_id})
    claim_rtts.append((time.perf_counter() - start) * 1000.0)
    if answer.status_code != 200:
        result["why"] = f"the rescuer's claim answered {answer.status_code}"
        return result
    lease = answer.json()
    committed = http.upload_and_complete(rescuer, lease)
    committed_at = time.time()
    task = rescuer.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]
    state = rescuer.get(f"/v1alpha1/jobs/{job_id}").json()["state"]
    if committed != {"accepted": True} or task["state"] != "COMPLETED" or state != "SUCCEEDED":
        result["why"] = f"commit {committed}, task {task['state']}, job {state}"
        return result
    if task["expiries"] != 1 or lease["attempt_number"] != 2 or lease["task_id"] != claimed["task_id"]:
        result["why"] = f"unexpected recovery: task {task}, rescuer lease attempt {lease['attempt_number']}"
        return result
    result["mttr_s"] = committed_at - expired_at
    result["recovered"] = True
    return result


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    missing = http.service_missing()
    if missing:
        return skipped_rows(NAME, SECTION, METRICS, missing)
    kills = 1 if smoke else max(repeats, MIN_KILLS)
    work_dir = http.make_work_dir(NAME)
    outcomes: list[dict[str, Any]] = []
    try:
        fs = filesystem_type(work_dir)
        with http.serving(work_dir / "coordinator", sweep_interval_s=SWEEP_INTERVAL_S) as server, \
                http.http_client(server.url) as rescuer:
            http.register(rescuer, "rescuer")
            for index in range(kills):
                outcomes.append(_one_kill(server.url, rescuer, index))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return _rows(outcomes, kills, fs)


def _rows(outcomes: list[dict[str, Any]], kills: int, fs: str) -> list[dict[str, Any]]:
    recovered = sum(1 for o in outcomes if o["recovered"])
    mttd = [o["mttd_s"] for o in outcomes if "mttd_s" in o]
    over = [value for value in mttd if value > BOUND_S]
    failures = [o["why"] for o in outcomes if not o["recovered"]]
    setup = (f"`flashruntime serve` subprocess on 127.0.0.1 (data on {fs} under benchmarks/.work), sweep interval "
             f"{SWEEP_INTERVAL_S:g} s (FLASHML_SWEEP_INTERVAL_S), one-task "
             f"hyperparameter_search job per kill with lease_seconds {LEASE_SECONDS:g}; the worker subprocess heartbeats "
             f"every {HEARTBEAT_S:g} s and is SIGKILLed right after heartbeat answer number {HEARTBEATS_BEFORE_KILL}")
    count = f"{recovered} of {kills} expired leases re-claimed by a second client and committed (accepted, job SUCCEEDED)"
    notes_common = [setup, count] + [f"not recovered: {why}" for why in failures]
    bound = (f"bound lease_seconds + sweep_interval_s = {BOUND_S:g} s after the last heartbeat; "
             f"{len(over)} of {len(mttd)} samples over it" + (f" ({', '.join(f'{v:.3f} s' for v in over)})" if over else ""))
    rows: list[dict[str, Any]] = []

    def add(metric: str, unit: str, samples: list[float], notes: list[str], empty: str) -> None:
        if samples:
            rows.append(measured_row(NAME, SECTION, metric, unit, samples, notes=[*notes, *notes_common]))
        else:
            rows.append(skipped_row(NAME, SECTION, metric, unit, empty, notes=notes_common))

    add("mttd_s", "s", mttd,
        [("MTTD = LEASE_EXPIRED event timestamp (coordinator clock) − the kill's wall-clock time (same host); "
          "detected by the background sweep: the rescuer only reads the events route, which never sweeps"), bound],
        "no LEASE_EXPIRED observed")
    add("mttr_s", "s", [o["mttr_s"] for o in outcomes if "mttr_s" in o],
        [("MTTR = LEASE_EXPIRED timestamp → the rescuer's claim → PUT metrics.json → complete answered "
          f"accepted=true (includes the rescuer's events poll, every {EVENT_POLL_S * 1000:g} ms)")],
        "no expired lease was re-claimed and committed")
    add("sweep_lag_after_deadline_s", "s", [o["sweep_lag_s"] for o in outcomes if "sweep_lag_s" in o],
        [("LEASE_EXPIRED timestamp − the lease deadline of the worker's last heartbeat answer (how late the sweep "
          f"noticed; at most sweep_interval_s = {SWEEP_INTERVAL_S:g} s plus the sweep's own run time)")],
        "no LEASE_EXPIRED observed")
    rows.append(measured_row(
        NAME, SECTION, "leases_recovered", "per kill", [1.0 if o["recovered"] else 0.0 for o in outcomes],
        notes=["1 per kill whose expired lease was re-claimed and committed, else 0", *notes_common],
    ))
    round_trips = (
        ("claim_rtt_ms", "claim_rtts",
         "POST /v1alpha1/leases/claim by the worker and by the rescuer, each on a warm keep-alive connection"),
        ("heartbeat_rtt_ms", "heartbeat_rtts", "POST /v1alpha1/attempts/{id}/heartbeat by the worker"),
    )
    for metric, key, what in round_trips:
        samples = [rtt for o in outcomes for rtt in o[key]]
        stats = (f"p50 = {quantile(samples, 0.5):.2f} ms (the row's median), p95 = {quantile(samples, 0.95):.2f} ms "
                 f"over {len(samples)} round trips (linear interpolation)") if samples else ""
        measured = (f"round trip measured in the client (perf_counter): {what}; every round trip of every kill is "
                    "one sample")
        add(metric, "ms", samples, [measured, stats], "no round trip measured")
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        f"a lease whose worker is SIGKILLed is detected as expired within lease_seconds + sweep_interval_s "
        f"({LEASE_SECONDS:g} + {SWEEP_INTERVAL_S:g} s here) and its task is re-claimed and committed by another "
        "client within a second after that"
    ),
    section=SECTION,
    run=run,
)
