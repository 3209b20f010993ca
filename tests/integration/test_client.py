"""The one coordinator client: every route it speaks against a real coordinator on
127.0.0.1, its error mapping, and its one retry rule against a scripted server."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime.client import NO_RETRY, CoordinatorClient, RetryPolicy, is_transient
from flashruntime.errors import ArtifactNotFound, CoordinatorHTTPError, CoordinatorUnavailable
from tests.integration.test_service_app import job_spec, registration

# --- the retry rule -------------------------------------------------------------------------------


def test_the_retry_delay_doubles_up_to_its_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=6, backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    busy = CoordinatorHTTPError("GET", "/x", 429, "slow down", retry_after_s=2.5)
    assert policy.delay(1, busy) == 2.5  # the server asked for longer
    assert RetryPolicy(max_backoff_s=1.0).delay(1, CoordinatorHTTPError("GET", "/x", 429, "", retry_after_s=60)) == 1.0
    with pytest.raises(ValueError, match="attempts must be an int >= 1"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="backoff_s must be a finite number"):
        RetryPolicy(backoff_s=float("nan"))


def test_run_repeats_transient_failures_only() -> None:
    waits: list[float] = []
    policy = RetryPolicy(attempts=3, backoff_s=0.1, sleep=waits.append)
    failures = [CoordinatorUnavailable("down"), CoordinatorHTTPError("GET", "/x", 503, "busy")]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    assert policy.run(flaky) == "ok" and waits == [0.1, 0.2]
    with pytest.raises(CoordinatorHTTPError):
        policy.run(lambda: (_ for _ in ()).throw(CoordinatorHTTPError("GET", "/x", 404, "no")))
    assert waits == [0.1, 0.2]  # a 404 is an answer: no wait, no retry
    assert is_transient(CoordinatorHTTPError("GET", "/x", 429, "")) and not is_transient(ValueError())


# --- against a real coordinator ---------------------------------------------------------------------


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("fastapi")
    from tests.service_server import serve_in_thread, settings_for

    monkeypatch.setenv("FLASHML_NODE_TOKENS", "node-a:tok-node")
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-alice")
    monkeypatch.setenv("FLASHML_OPERATOR_TOKENS", "root:tok-root")
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        yield url


@pytest.mark.service
def test_every_route_through_the_client(coordinator: str, tmp_path: Path) -> None:
    alice = CoordinatorClient(coordinator, token="tok-alice")
    node = CoordinatorClient(coordinator, token="tok-node")
    root = CoordinatorClient(coordinator, token="tok-root")
    assert alice.authenticates and "tok" not in repr(alice)

    assert node.register(registration("ignored"))["node_id"] == "node-a"
    assert node.node_heartbeat("node-a", {"node_id": "node-a"}) == {"status": "ok"}
    record = alice.submit_job(job_spec(trials=1))
    job_id = record["job_id"]
    assert alice.job_state(job_id) == "RUNNING" and [j["job_id"] for j in alice.jobs()] == [job_id]
    assert [e["type"] for e in alice.events(job_id)][:2] == ["JOB_ACCEPTED", "BACKEND_SELECTED"]
    assert alice.logs(job_id) == {"logs": "--- trial-000 (PENDING) ---\n", "tasks": [
        {"task_id": "trial-000", "state": "PENDING", "node_id": None, "log": "", "truncated": False, "attempt": None}]}
    lease = node.claim("node-a")
    assert lease is not None and lease["job_id"] == job_id and node.claim("node-a") is None  # 204: nothing left
    assert node.attempt_heartbeat(lease["lease_id"])["lease_id"] == lease["lease_id"]
    metrics = tmp_path / "metrics.json"
    metrics.write_bytes(b'{"score": 1}')
    key = f"{lease['payload']['output_prefix']}metrics.json"
    assert node.put_artifact(key, metrics)["size_bytes"] == len(b'{"score": 1}')  # streamed from the file
    import hashlib

    done = node.complete(lease["lease_id"], {"output_sha256": hashlib.sha256(b'{"score": 1}').hexdigest()})
    assert done == {"accepted": True}
    assert [t["state"] for t in alice.tasks(job_id)] == ["COMPLETED"]
    assert [a["key"] for a in alice.job_artifacts(job_id)] == [key]
    assert alice.get_artifact(key) == b'{"score": 1}'
    assert alice.download(key, tmp_path / "copy.json") == 12 and (tmp_path / "copy.json").read_bytes() == metrics.read_bytes()
    assert alice.put_json_artifact("users/alice/params.json", {"lr": 0.1})["size_bytes"] == len('{"lr": 0.1}')
    assert [n["node_id"] for n in root.nodes()] == ["node-a"]
    assert root.cancel(job_id)["state"] == "SUCCEEDED"  # a finished job is returned unchanged


@pytest.mark.service
def test_failures_map_to_the_error_family(coordinator: str) -> None:
    anonymous = CoordinatorClient(coordinator, retry=NO_RETRY)
    with pytest.raises(CoordinatorHTTPError) as refused:
        anonymous.jobs()
    assert refused.value.status == 401 and "FLASHML_TOKEN" in refused.value.detail
    alice = CoordinatorClient(coordinator, token="tok-alice")
    with pytest.raises(ArtifactNotFound) as missing:
        alice.get_artifact("users/alice/none.csv")
    assert missing.value.status == 404 and isinstance(missing.value, LookupError)
    with pytest.raises(CoordinatorHTTPError) as invalid:
        alice.submit_job({"kind": "Job"})
    assert invalid.value.status == 422 and "\n  body.metadata: Field required" in invalid.value.detail
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = CoordinatorClient(f"http://127.0.0.1:{closed}", retry=RetryPolicy(attempts=2, backoff_s=0.0))
    with pytest.raises(CoordinatorUnavailable, match=f"GET http://127.0.0.1:{closed}/v1alpha1/jobs"):
        unreachable.jobs()
    with pytest.raises(ValueError, match="http"):
        CoordinatorClient("localhost:8100")


# --- what is repeated and what is not, against a scripted server --------------------------------------


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each request with the next scripted (status, body, headers), the body as JSON
    unless it is bytes; records what was asked."""

    def __init__(self, answers: list[tuple[int, Any, dict[str, str]]]) -> None:
        self.answers = answers
        self.seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(handler) -> None:  # noqa: N805
                length = int(handler.headers.get("Content-Length") or 0)
                handler.rfile.read(length)
                self.seen.append(f"{handler.command} {handler.path}")
                status, body, headers = self.answers.pop(0)
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                handler.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    handler.send_header(name, value)
                handler.send_header("Content-Length", str(len(raw)))
                handler.end_headers()
                handler.wfile.write(raw)

            do_GET = do_POST = do_PUT = _answer

            def log_message(handler, *args: Any) -> None:  # noqa: N805
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def __enter__(self) -> Scripted:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_reads_are_retried_and_a_submit_only_after_a_429() -> None:
    waits: list[float] = []
    policy = RetryPolicy(attempts=3, backoff_s=0.01, sleep=waits.append)
    busy = (503, {"detail": "busy"}, {})
    with Scripted([busy, busy, (200, {"state": "RUNNING"}, {})]) as server:
        assert CoordinatorClient(server.url, retry=policy).job_state("j1") == "RUNNING"
        assert len(server.seen) == 3
    with Scripted([busy]) as server, pytest.raises(CoordinatorHTTPError) as failed:
        CoordinatorClient(server.url, retry=policy).submit_job({"kind": "Job"})
    assert failed.value.status == 503 and len(server.seen) == 1  # a repeat could submit the job twice
    waits.clear()
    limited = (429, {"detail": "too many requests"}, {"Retry-After": "1"})
    with Scripted([limited, (201, {"job_id": "j2"}, {})]) as server:
        assert CoordinatorClient(server.url, retry=policy).submit_job({"kind": "Job"}) == {"job_id": "j2"}
        assert server.seen == ["POST /v1alpha1/jobs", "POST /v1alpha1/jobs"] and waits == [1.0]
    with Scripted([busy]) as server, pytest.raises(CoordinatorHTTPError):
        CoordinatorClient(server.url, retry=policy).fail("ls-1", "boom")  # a repeat could fail it twice
    with Scripted([(200, b"<html>", {})]) as server, pytest.raises(CoordinatorHTTPError, match="not JSON"):
        CoordinatorClient(server.url, retry=policy).nodes()
