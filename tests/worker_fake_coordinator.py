"""A stdlib stand-in for the coordinator's node, lease and artifact routes, for
worker-agent tests: a ``ThreadingHTTPServer`` on 127.0.0.1 that hands out queued leases,
records every request, and can be told to answer a route with a given status.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flashruntime.protocol.v1alpha1 import Lease, utcnow


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names: HTTP header names are case-insensitive
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeCoordinator:
    """State lives in plain attributes; tests set the ``*_statuses`` queues to force answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.registrations: list[dict[str, Any]] = []
        self.registered: set[str] = set()
        self.queued: deque[dict[str, Any]] = deque()  # (job_id, task_id, payload, lease_seconds, lease_id)
        self.leases: dict[str, dict[str, Any]] = {}  # lease_id -> lease JSON as handed out
        self.completed: dict[str, dict[str, Any]] = {}
        self.failed: dict[str, str] = {}
        self.released: dict[str, dict[str, Any]] = {}  # lease_id -> the release body
        self.supports_release = True  # False: a coordinator older than the release route (404)
        self.on_claim: Callable[[], None] | None = None  # called before a claim is answered
        self.artifacts: dict[str, bytes] = {}
        self.lost: set[str] = set()  # lease ids whose heartbeats answer 410 from now on
        self.register_statuses: deque[int] = deque()
        self.node_heartbeat_statuses: deque[int] = deque()
        self.claim_statuses: deque[int] = deque()
        self.assigned_node_id: str | None = None  # answer registrations with this node id (auth front)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # setup ---------------------------------------------------------------------
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                record = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with fake.lock:
                    fake.requests.append(record)
                status, answer = fake.route(record)
                payload = b"" if answer is None else (answer if isinstance(answer, bytes)
                                                      else json.dumps(answer).encode())
                self.send_response(status)
                if payload:
                    kind = "application/octet-stream" if isinstance(answer, bytes) else "application/json"
                    self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if payload:
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def add_lease(self, payload: dict[str, Any], *, job_id: str = "job1", task_id: str = "task-000",
                  lease_seconds: float = 30.0) -> str:
        lease_id = "ls-" + uuid.uuid4().hex[:12]
        with self.lock:
            self.queued.append({"job_id": job_id, "task_id": task_id, "payload": payload,
                                "lease_seconds": lease_seconds, "lease_id": lease_id})
        return lease_id

    # queries -------------------------------------------------------------------
    def calls(self, method: str, pattern: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    # routes ----------------------------------------------------------------------
    def route(self, r: Recorded) -> tuple[int, Any]:
        path = r.path
        with self.lock:
            if r.method == "POST" and path == "/v1alpha1/nodes/register":
                if self.register_statuses:
                    return self.register_statuses.popleft(), {"detail": "forced"}
                body = r.json()
                node_id = self.assigned_node_id or body["node_id"]
                self.registrations.append(body)
                self.registered.add(node_id)
                return 200, {"node_id": node_id, "status": "registered"}
            match = re.fullmatch(r"/v1alpha1/nodes/([^/]+)/heartbeat", path)
            if r.method == "POST" and match:
                if self.node_heartbeat_statuses:
                    return self.node_heartbeat_statuses.popleft(), {"detail": "forced"}
                return (200, {"status": "ok"}) if match.group(1) in self.registered else (404, {"detail": "?"})
            if r.method == "POST" and path == "/v1alpha1/leases/claim":
                if self.claim_statuses:
                    return self.claim_statuses.popleft(), {"detail": "forced"}
                if self.on_claim is not None:
                    self.on_claim()
                node_id = r.json()["node_id"]
                if node_id not in self.registered:
                    return 403, {"detail": "node not registered"}
                if not self.queued:
                    return 204, None
                item = self.queued.popleft()
                lease = Lease(lease_id=item["lease_id"], task_id=item["task_id"], job_id=item["job_id"],
                              node_id=node_id, attempt_number=1, payload=item["payload"],
                              deadline=utcnow() + timedelta(seconds=item["lease_seconds"]),
                              lease_seconds=item["lease_seconds"]).model_dump(mode="json")
                self.leases[item["lease_id"]] = lease
                return 200, lease
            match = re.fullmatch(r"/v1alpha1/attempts/([^/]+)/(heartbeat|complete|fail|release)", path)
            if r.method == "POST" and match:
                lease_id, action = match.groups()
                if action == "release" and not self.supports_release:
                    return 404, {"detail": "Not Found"}
                if lease_id not in self.leases:
                    return 404, {"detail": "unknown lease"}
                live = lease_id not in self.lost and lease_id not in self.completed and lease_id not in self.failed \
                    and lease_id not in self.released
                if action == "release":
                    if not live:
                        return 410, {"detail": "lease is no longer live"}
                    self.released[lease_id] = r.json()
                    return 200, {"status": "requeued"}
                if action == "heartbeat":
                    return (200, self.leases[lease_id]) if live else (410, {"detail": "lease is no longer live"})
                if action == "complete":
                    self.completed[lease_id] = r.json()
                    return 200, {"accepted": True}
                if not live:
                    return 410, {"detail": "lease is no longer live"}
                self.failed[lease_id] = r.json()["reason"]
                return 200, {"status": "requeued-or-exhausted"}
            match = re.fullmatch(r"/v1alpha1/artifacts/(.+)", path)
            if match:
                key = match.group(1)
                if r.method == "PUT":
                    self.artifacts[key] = r.body
                    return 200, {"uri": f"artifact://{key}", "backend": "local", "bucket": "fake",
                                 "object_key": key, "size_bytes": len(r.body)}
                if r.method == "GET":
                    return (200, self.artifacts[key]) if key in self.artifacts else (404, {"detail": "no artifact"})
        return 404, {"detail": f"no route {r.method} {path}"}
