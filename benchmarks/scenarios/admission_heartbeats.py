"""``admission_heartbeats``: a node's heartbeats while a 10,000-task job is admitted, against
the same heartbeats with nothing admitted, on one real ``flashruntime serve`` (SQLite).

One node registers and holds a lease; a thread sends, every ``BEAT_INTERVAL_S``, the node's
heartbeat (POST /v1alpha1/nodes/{id}/heartbeat) and the lease's renewal (POST
/v1alpha1/attempts/{id}/heartbeat), each timed in the client. Idle baseline: the beats of
``IDLE_S`` with no other request. During admission: the beats sent while POST
/v1alpha1/jobs of a 10,000-trial hyperparameter_search job is in flight (from another
connection). Each sample is one repeat's 99th percentile; the ratio is admission over idle.
The refusal rows time bodies the bounds refuse (340,000 trials, 340,000 command parameter
sets, a 90 KB value over a 10,000-value grid), each answered 422 or 413.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from typing import Any, Self

from benchmarks.host import filesystem_type
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, quantile, skipped_rows
from benchmarks.scenarios import _coordinator_http as http
from benchmarks.targets import HEARTBEAT_P99_DURING_ADMISSION_S, REFUSAL_S

NAME = "admission_heartbeats"
SECTION = "performance"
TASKS = 10_000
SMOKE_TASKS = 10_000  # the admission is the point; a smoke run makes fewer repeats, not a smaller job
BEAT_INTERVAL_S = 0.1
IDLE_S = 2.0
MIN_REPEATS = 3
NODE = "beating-node"
REFUSED = (("trials_340k", 422), ("task_params_340k", 422), ("grid_90kb_x_10k", 413))
METRICS = (("heartbeat_p99_during_admission_s", "s"), ("admission_s", "s"),
           *((f"refusal_{name}_s", "s") for name, _ in REFUSED))


def _refused_body(name: str) -> bytes:
    spec = http.job_spec(1, 60.0, name="refused")
    parameters = spec["spec"]["workload"]["parameters"]
    if name == "trials_340k":
        parameters["trials"] = [{}] * 340_000
    elif name == "grid_90kb_x_10k":
        del parameters["trials"]
        parameters["grid"] = {"blob": ["x" * 90_000], "i": list(range(10_000))}
    else:
        spec["spec"]["isolation"] = {"tier": "sandboxed"}
        spec["spec"]["workload"] = {"type": "command", "parameters": {"command": ["true"],
                                                                       "task_params": [{}] * 340_000}}
    return json.dumps(spec, separators=(",", ":")).encode()


class _Beater:
    """The node's beats in a thread: (start, seconds) of every request, until stopped."""

    def __init__(self, url: str, lease_id: str) -> None:
        self.url, self.lease_id = url, lease_id
        self.beats: list[tuple[float, float]] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="beater", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with http.http_client(self.url) as client:
            while not self._stop.is_set():
                for path, body in ((f"/v1alpha1/nodes/{NODE}/heartbeat", {"node_id": NODE}),
                                   (f"/v1alpha1/attempts/{self.lease_id}/heartbeat", None)):
                    start = time.perf_counter()
                    answer = client.post(path, json=body)
                    self.beats.append((start, time.perf_counter() - start))
                    if answer.status_code != 200:
                        self.problems.append(f"{path}: {answer.status_code} {answer.text[:200]}")
                self._stop.wait(BEAT_INTERVAL_S)

    def between(self, start: float, end: float) -> list[float]:
        return [seconds for began, seconds in self.beats if start <= began <= end]


def _one_repeat(url: str, submitter: Any, lease_id: str, tasks: int) -> dict[str, Any]:
    with _Beater(url, lease_id) as beater:
        idle_start = time.perf_counter()
        time.sleep(IDLE_S)
        idle = beater.between(idle_start, time.perf_counter())
        started = time.perf_counter()
        http.submit(submitter, http.job_spec(tasks, 60.0, name="admitted"))
        ended = time.perf_counter()
        time.sleep(2 * BEAT_INTERVAL_S)
    during = beater.between(started, ended)
    if beater.problems:
        raise RuntimeError(f"a beat was refused: {beater.problems[0]}")
    return {"idle": idle, "during": during, "admission_s": ended - started}


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    missing = http.service_missing()
    if missing:
        return skipped_rows(NAME, SECTION, METRICS, missing)
    count = 1 if smoke else max(repeats, MIN_REPEATS)
    tasks = SMOKE_TASKS if smoke else TASKS
    work_dir = http.make_work_dir(NAME)
    outcomes: list[dict[str, Any]] = []
    refusals: dict[str, list[float]] = {name: [] for name, _ in REFUSED}
    try:
        fs = filesystem_type(work_dir)
        with http.serving(work_dir / "coordinator") as server, http.http_client(server.url, 120.0) as client:
            http.register(client, NODE)
            http.submit(client, http.job_spec(1, 60.0, name="held"))
            lease = client.post("/v1alpha1/leases/claim", json={"node_id": NODE}).json()
            for _ in range(count):
                outcomes.append(_one_repeat(server.url, client, lease["lease_id"], tasks))
                for name, status in REFUSED:
                    body = _refused_body(name)
                    start = time.perf_counter()
                    answer = client.post("/v1alpha1/jobs", content=body, headers={"content-type": "application/json"})
                    refusals[name].append(time.perf_counter() - start)
                    if answer.status_code != status:
                        raise RuntimeError(f"{name}: expected {status}, got {answer.status_code} {answer.text[:200]}")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return _rows(outcomes, refusals, tasks, fs)


def _rows(outcomes: list[dict[str, Any]], refusals: dict[str, list[float]], tasks: int,
          fs: str) -> list[dict[str, Any]]:
    setup = (f"`flashruntime serve` subprocess on 127.0.0.1, SQLite on {fs} under benchmarks/.work, default bounds; "
             f"one node beats every {BEAT_INTERVAL_S:g} s (node heartbeat, then its lease's renewal, each one sample) "
             f"on its own keep-alive connection")
    during_p99 = [quantile(o["during"], 0.99) for o in outcomes if o["during"]]
    idle_p99 = [quantile(o["idle"], 0.99) for o in outcomes if o["idle"]]
    beats = (f"{sum(len(o['during']) for o in outcomes)} beats during admission, "
             f"{sum(len(o['idle']) for o in outcomes)} idle, over {len(outcomes)} repeats; the slowest during "
             f"admission {max((max(o['during']) for o in outcomes if o['during']), default=0.0):.3f} s")
    rows = [
        measured_row(NAME, SECTION, "heartbeat_p99_during_admission_s", "s", during_p99,
                     comparator=("idle baseline (same server, no submit)", idle_p99),
                     target=HEARTBEAT_P99_DURING_ADMISSION_S,
                     notes=[(f"p99 of the beats sent while a {tasks}-task hyperparameter_search job was admitted, "
                             "one sample per repeat; ratio = over the idle p99 of the same repeat's first "
                             f"{IDLE_S:g} s"), beats, setup]),
        measured_row(NAME, SECTION, "admission_s", "s", [o["admission_s"] for o in outcomes],
                     notes=[(f"POST /v1alpha1/jobs of {tasks} trials answered 201 (expansion, one queueing "
                             "transaction, the ledger's events)"), setup]),
    ]
    for name, status in REFUSED:
        rows.append(measured_row(NAME, SECTION, f"refusal_{name}_s", "s", refusals[name], target=REFUSAL_S,
                                 notes=[(f"POST /v1alpha1/jobs of {len(_refused_body(name))} bytes answered "
                                         f"{status}: the body's strict JSON parse and model validation, then the "
                                         "bound"), setup]))
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(f"while a {TASKS}-task job is admitted, a node's heartbeats and lease renewals are still answered "
                "within 1 s at p99, and a job over the bounds is refused within 1 s"),
    section=SECTION,
    run=run,
)
