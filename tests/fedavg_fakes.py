"""Test doubles for the FedAvg driver: an in-process coordinator and a stdlib HTTP front for it.

``FakeCoordinator`` expands a ``federated_averaging`` round into ``shard-NNN`` tasks and runs a
worker function for each when the round is submitted; each task's files appear under
``jobs/<job>/<task>/`` after a configurable number of ``artifacts()`` polls. ``FakeHttpServer``
serves the same backend over the coordinator's routes on 127.0.0.1, where a test needs to script
the coordinator (hold rounds back, answer chosen requests with an HTTP error).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from flashruntime.errors import ArtifactNotFound

# (task_id, params incl. shard, weights bytes or None) -> {file name: bytes} (must hold metrics.json), or None
Worker = Callable[[str, dict[str, Any], "bytes | None"], "dict[str, bytes] | None"]


def quadratic_worker(targets: list[list[float]], *, scale: dict[int, float] | None = None) -> Worker:
    """Shard i moves the weights ``w`` a step ``lr·(target_i − w)`` (exact float arithmetic, no torch).

    ``scale`` multiplies chosen shards' deltas (an adversary sending a well-formed but huge delta).
    """

    def worker(task_id: str, params: dict[str, Any], weights: bytes | None) -> dict[str, bytes]:
        shard = params["shard"]
        target = targets[shard % len(targets)]
        current = json.loads(weights)["w"]["data"] if weights else [0.0] * len(target)
        factor = (scale or {}).get(shard, 1.0)
        delta = [params["lr"] * (t - c) * factor for t, c in zip(target, current)]
        loss = sum((t - c) ** 2 for t, c in zip(target, current))
        metrics = {"round": params["round"], "shard": shard, "samples": 10 + shard, "loss": loss,
                   "local_steps": 1, "delta_file": "delta.json"}
        return {"metrics.json": json.dumps(metrics).encode(), "delta.json": json.dumps(
            {"w": {"shape": [len(delta)], "data": delta}}).encode()}

    return worker


class FakeCoordinator:
    """In-process ``Coordinator``: submit runs the worker for every shard; commits surface on later polls."""

    def __init__(self, worker: Worker, *, commit_after: dict[str, int] | None = None,
                 job_state: str | None = None, not_completed: frozenset[str] = frozenset()) -> None:
        self.worker = worker
        self.commit_after = commit_after or {}  # task id -> artifacts() polls before its files appear
        self.forced_state = job_state  # e.g. "FAILED"
        self.not_completed = not_completed  # tasks listed without COMPLETED although their files exist
        self.store: dict[str, bytes] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.bodies: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.raise_next: dict[str, list[BaseException]] = {}
        self.hold_from_round: int | None = None  # rounds >= this never commit while set
        self.lock = threading.Lock()

    def _maybe_fail(self, method: str) -> None:
        self.calls.append(method)
        pending = self.raise_next.get(method)
        if pending:
            raise pending.pop(0)

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("submit")
        with self.lock:
            job_id = f"{len(self.jobs) + 1:012x}"
            self.bodies.append(json.loads(json.dumps(body)))
            params = body["spec"]["workload"]["parameters"]
            weights = None
            if "weights" in params:
                weights = self.store[params["weights"].removeprefix("artifact://")]
            outputs = {}
            for shard in range(params["num_shards"]):
                task = f"shard-{shard:03d}"
                worker_params = {k: v for k, v in params.items() if k not in ("weights", "lease_seconds")}
                worker_params["shard"] = shard
                outputs[task] = self.worker(task, worker_params, weights)
            self.jobs[job_id] = {"round": params["round"], "outputs": outputs, "polls": 0, "committed": set()}
            return {"job_id": job_id, "state": "RUNNING"}

    def _advance(self, job_id: str) -> dict[str, Any]:
        job = self.jobs[job_id]
        held = self.hold_from_round is not None and job["round"] >= self.hold_from_round
        for task, files in job["outputs"].items():
            if held or files is None or task in job["committed"]:
                continue
            if job["polls"] >= self.commit_after.get(task, 0):
                for name, raw in files.items():
                    self.store[f"jobs/{job_id}/{task}/{name}"] = raw
                job["committed"].add(task)
        return job

    def job_state(self, job_id: str) -> str:
        self._maybe_fail("job_state")
        with self.lock:
            job = self.jobs[job_id]
            if self.forced_state:
                return self.forced_state
            return "SUCCEEDED" if len(job["committed"]) == len(job["outputs"]) else "RUNNING"

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        self._maybe_fail("artifacts")
        with self.lock:
            self._advance(job_id)
            self.jobs[job_id]["polls"] += 1
            prefix = f"jobs/{job_id}/"
            return [{"uri": f"artifact://{k}", "key": k, "size_bytes": len(v)}
                    for k, v in sorted(self.store.items()) if k.startswith(prefix)]

    def tasks(self, job_id: str) -> list[dict[str, Any]]:
        self._maybe_fail("tasks")
        with self.lock:
            job = self.jobs[job_id]
            return [{"task_id": t, "state": "COMPLETED" if t in job["committed"] and t not in self.not_completed
                     else "LEASED"} for t in sorted(job["outputs"])]

    def get_artifact(self, key: str) -> bytes:
        self._maybe_fail("get_artifact")
        with self.lock:
            if key not in self.store:
                raise ArtifactNotFound(f"artifact {key!r} not found")
            return self.store[key]

    def put_bytes(self, key: str, raw: bytes) -> dict[str, Any]:
        with self.lock:
            self.store[key] = raw
        return {"uri": f"artifact://{key}", "key": key, "size_bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest()}

    def put_artifact(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("put_artifact")
        return self.put_bytes(key, json.dumps(body).encode())


class ParsedJsonCoordinator(FakeCoordinator):
    """A user-written ``Coordinator`` whose ``get_artifact`` returns the parsed JSON (a fresh ``dict``
    or ``list`` per call), as coordinators written for 0.4 did, and that offers no ``tasks``."""

    tasks = None  # type: ignore[assignment]

    def get_artifact(self, key: str) -> Any:  # type: ignore[override]
        return json.loads(super().get_artifact(key))


class FakeCoordinatorWithoutTasks(FakeCoordinator):
    """A coordinator that offers no ``tasks`` route (the driver probes for it)."""

    tasks = None  # type: ignore[assignment]


class FakeHttpServer:
    """The driver-facing routes over a ``FakeCoordinator``, on 127.0.0.1 (stdlib only)."""

    def __init__(self, backend: FakeCoordinator) -> None:
        self.backend = backend
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_next: list[tuple[str, str, int]] = []  # (method, path prefix, status) answered once
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: Any, raw: bool = False) -> None:
                body = payload if raw else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if raw else "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                path = urlsplit(self.path).path
                server.requests.append((method, path, dict(self.headers)))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                for i, (m, prefix, status) in enumerate(server.fail_next):
                    if m == method and path.startswith(prefix):
                        del server.fail_next[i]
                        return self._send(status, {"detail": f"injected {status}"})
                try:
                    self._route(method, path, raw)
                except ArtifactNotFound as exc:
                    self._send(404, {"detail": str(exc)})
                except KeyError as exc:
                    self._send(404, {"detail": f"unknown {exc}"})

            def _route(self, method: str, path: str, raw: bytes) -> None:
                b = server.backend
                parts = path.strip("/").split("/")
                if method == "POST" and path == "/v1alpha1/jobs":
                    return self._send(201, b.submit(json.loads(raw)))
                if parts[:2] == ["v1alpha1", "artifacts"] and len(parts) > 2:
                    key = unquote("/".join(parts[2:]))
                    if method == "PUT":
                        return self._send(200, b.put_bytes(key, raw))
                    return self._send(200, b.get_artifact(key), raw=True)
                if method == "GET" and parts[:2] == ["v1alpha1", "jobs"] and len(parts) == 3:
                    return self._send(200, {"job_id": parts[2], "state": b.job_state(parts[2])})
                if method == "GET" and parts[:2] == ["v1alpha1", "jobs"] and len(parts) == 4:
                    if parts[3] == "artifacts":
                        return self._send(200, b.artifacts(parts[2]))
                    if parts[3] == "tasks":
                        return self._send(200, b.tasks(parts[2]))
                return self._send(404, {"detail": "Not Found"})

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)
