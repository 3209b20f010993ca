"""``flashruntime submit-spec / status / events / cancel`` (and the errors of ``logs``) against a stdlib fake
coordinator on 127.0.0.1: method, path, body, printed JSON and exit codes
(0 success, 1 HTTP status >= 400 or a bad spec file, 2 unreachable or pyyaml missing), and
where the URL comes from (``--api`` > FLASHML_RUNTIME_API > http://localhost:8100)."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flashruntime.cli import _api
from flashruntime.cli import dispatch as cli
from tests._support import run_core_only

JOBS_MODULE = "flashruntime.cli.jobs"
RECORD = {"job_id": "0123456789ab", "name": "sweep-a", "state": "RUNNING", "backend": "leases"}
SPEC = {
    "apiVersion": "flashml.dev/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "sweep-a"},
    "spec": {"image": {"repository": "python", "tag": "3.11"},
             "workload": {"type": "command", "parameters": {"command": ["python", "-c", "pass"]}}},
}
SPEC_YAML = """\
apiVersion: flashml.dev/v1alpha1
kind: Job
metadata:
  name: sweep-a
spec:
  image:
    repository: python
    tag: "3.11"
  workload:
    type: command
    parameters:
      command: ["python", "-c", "pass"]
"""
VALIDATION_422 = {"detail": [
    {"type": "missing", "loc": ["body", "spec", "image"], "msg": "Field required", "input": {}},
    {"type": "string_type", "loc": ["body", "metadata", "name"], "msg": "Input should be a valid string",
     "input": 3},
]}


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeCoordinator:
    """Answers ``routes[(method, path)] = (status, payload)``; payload bytes go out raw,
    anything else as JSON. Unknown routes get FastAPI's 404."""

    url: str
    routes: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)


def _handler_for(fake: FakeCoordinator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            fake.requests.append(Recorded(self.command, self.path, dict(self.headers.items()), body))
            status, payload = fake.routes.get((self.command, self.path), (404, {"detail": "Not Found"}))
            raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream" if isinstance(payload, bytes)
                             else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

    return Handler


@pytest.fixture
def serve_fake() -> Iterator[Callable[[], FakeCoordinator]]:
    servers: list[ThreadingHTTPServer] = []

    def start() -> FakeCoordinator:
        fake = FakeCoordinator(url="")
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(fake))
        fake.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return fake

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake(serve_fake: Callable[[], FakeCoordinator]) -> FakeCoordinator:
    return serve_fake()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_RUNTIME_API", raising=False)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # loopback must not go through a proxy


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """``flashruntime.cli.dispatch.main`` with the jobs module registered (once)."""
    modules = tuple(m for m in cli.COMMAND_MODULES if m != JOBS_MODULE) + (JOBS_MODULE,)
    monkeypatch.setattr(cli, "COMMAND_MODULES", modules)
    return lambda *argv: cli.main(list(argv))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


# --- submit-spec ---------------------------------------------------------------


def test_submit_spec_json_posts_the_file_and_prints_the_record(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("POST", "/v1alpha1/jobs")] = (201, RECORD)
    spec = _write(tmp_path, "job.json", json.dumps(SPEC))
    assert run_cli("--api", fake.url, "submit-spec", str(spec), "--json") == 0
    out = capsys.readouterr()
    assert out.out == json.dumps(RECORD, indent=2) + "\n"
    assert out.err == ""
    [request] = fake.requests
    assert (request.method, request.path) == ("POST", "/v1alpha1/jobs")
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.body) == SPEC


def test_submit_spec_yaml_sends_the_same_body_as_its_json_twin(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("yaml")
    fake.routes[("POST", "/v1alpha1/jobs")] = (201, RECORD)
    # any suffix other than .json is YAML; an unquoted timestamp goes out as ISO 8601
    spec = _write(tmp_path, "job.spec", SPEC_YAML + "  note: 2024-05-01\n")
    assert run_cli("--api", fake.url, "submit-spec", str(spec), "--json") == 0
    assert json.loads(capsys.readouterr().out) == RECORD
    assert json.loads(fake.requests[0].body) == {**SPEC, "spec": {**SPEC["spec"], "note": "2024-05-01"}}


def test_submit_spec_warns_about_each_key_jobspec_ignores_and_still_posts_the_file(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("POST", "/v1alpha1/jobs")] = (201, RECORD)
    misspelt = {**SPEC, "metadata": {"name": "sweep-a", "label": {"team": "a"}},
                "spec": {**SPEC["spec"], "retry_policy": {"maxTaskAttempts": 2},
                         "resources": {"gpu_per_task": 1, "maximumWorkers": 3}}}
    spec = _write(tmp_path, "job.json", json.dumps(misspelt))
    assert run_cli("--api", fake.url, "submit-spec", str(spec), "--json") == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        ("flashruntime submit-spec: warning: metadata.label is not a field of JobSpec and is ignored "
         "(did you mean 'labels'?)"),
        ("flashruntime submit-spec: warning: spec.retry_policy is not a field of JobSpec and is ignored "
         "(did you mean 'retryPolicy'?)"),
        ("flashruntime submit-spec: warning: spec.resources.gpu_per_task is not a field of JobSpec and is ignored "
         "(did you mean 'gpuPerTask'?)"),
    ]
    assert json.loads(out.out) == RECORD
    assert json.loads(fake.requests[0].body) == misspelt  # sent as written: the coordinator decides


def test_submit_spec_422_exits_1_with_each_validation_error(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("POST", "/v1alpha1/jobs")] = (422, VALIDATION_422)
    spec = _write(tmp_path, "job.json", json.dumps({"metadata": {"name": 3}}))
    assert run_cli("--api", fake.url, "submit-spec", str(spec)) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert f"flashruntime submit-spec: POST {fake.url}/v1alpha1/jobs -> 422" in out.err
    assert "\n  body.spec.image: Field required\n  body.metadata.name: Input should be a valid string" in out.err


def test_yaml_spec_without_pyyaml_exits_2_with_the_install_hint(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now raises ImportError
    spec = _write(tmp_path, "job.yaml", SPEC_YAML)
    assert run_cli("--api", fake.url, "submit-spec", str(spec)) == 2
    assert "pip install pyyaml" in capsys.readouterr().err
    assert fake.requests == []


@pytest.mark.parametrize(("name", "content", "message"), [
    ("broken.json", "{not json", "broken.json: not valid JSON"),
    ("list.json", "[1, 2]", "list.json: a JobSpec must be an object (apiVersion, kind, metadata, spec), got list"),
    ("scalar.yaml", "just words", "scalar.yaml: a JobSpec must be an object"),
    ("empty.yml", "", "empty.yml: a JobSpec must be an object (apiVersion, kind, metadata, spec), got an empty file"),
    ("broken.yaml", "spec: [unclosed", "broken.yaml: not valid YAML"),
    ("nan.json", '{"spec": NaN}', "nan.json: contains NaN or Infinity, which JSON cannot carry"),
    ("missing.json", None, "cannot read spec file"),
])
def test_bad_spec_file_exits_1_naming_the_file_and_sends_nothing(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    name: str, content: str | None, message: str,
) -> None:
    if name.endswith((".yaml", ".yml")):
        pytest.importorskip("yaml")
    path = tmp_path / name if content is None else _write(tmp_path, name, content)
    assert run_cli("--api", fake.url, "submit-spec", str(path)) == 1
    out = capsys.readouterr()
    assert message in out.err and out.out == ""
    assert fake.requests == []


# --- status / events / logs / cancel -------------------------------------------


@pytest.mark.parametrize(("command", "method", "suffix", "answer"), [
    ("status", "GET", "", RECORD),
    ("events", "GET", "/events", [{"type": "JOB_ACCEPTED", "message": "accepted"},
                                  {"type": "BACKEND_SELECTED", "message": "backend: leases (2 independent tasks)"}]),
    ("cancel", "POST", "/cancel", {**RECORD, "state": "CANCELLED"}),
])
def test_job_commands_call_their_route_and_print_pretty_json(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str],
    command: str, method: str, suffix: str, answer: Any,
) -> None:
    path = f"/v1alpha1/jobs/0123456789ab{suffix}"
    fake.routes[(method, path)] = (200, answer)
    assert run_cli("--api", fake.url, command, "0123456789ab", "--json") == 0
    assert capsys.readouterr().out == json.dumps(answer, indent=2) + "\n"
    [request] = fake.requests
    assert (request.method, request.path) == (method, path)
    assert request.body == b""


FAILED_RECORD = {"job_id": "0123456789ab", "state": "FAILED", "backend": "leases",
                 "created_at": "2026-01-01T00:00:00Z", "submitted_by": {"name": "alice"},
                 "spec": {"metadata": {"name": "sweep-a"}},
                 "error": "1 task failed: attempt 3 of task task-001: application_error (exit 1)"}
TASK_ROWS = [{"task_id": "task-000", "state": "COMPLETED"}, {"task_id": "task-001", "state": "FAILED"},
             {"task_id": "task-002", "state": "COMPLETED"}]


def test_status_reads_as_lines_with_its_tasks_and_the_reason_it_failed(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/0123456789ab")] = (200, FAILED_RECORD)
    fake.routes[("GET", "/v1alpha1/jobs/0123456789ab/tasks")] = (200, TASK_ROWS)
    assert run_cli("--api", fake.url, "status", "0123456789ab") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "job      0123456789ab (sweep-a)"
    assert lines[1].startswith("state    FAILED, submitted ") and lines[1].endswith(" ago, by alice")
    assert lines[2:] == ["tasks    3: 2 COMPLETED, 1 FAILED", "backend  leases",
                         "error    1 task failed: attempt 3 of task task-001: application_error (exit 1)"]


def test_a_failed_job_without_a_recorded_reason_says_where_to_look(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/0123456789ab")] = (200, {**FAILED_RECORD, "error": None})
    assert run_cli("--api", fake.url, "status", "0123456789ab") == 0  # no tasks route: the record alone
    out = capsys.readouterr().out
    assert "error    no reason recorded; flashruntime events 0123456789ab shows what happened" in out
    assert "tasks" not in out


def test_submit_spec_and_cancel_say_what_to_type_next(
    fake: FakeCoordinator, run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("POST", "/v1alpha1/jobs")] = (201, {**RECORD, "job_id": "0123456789ab"})
    fake.routes[("POST", "/v1alpha1/jobs/0123456789ab/cancel")] = (200, {**RECORD, "state": "CANCELLED"})
    assert run_cli("--api", fake.url, "submit-spec", str(_write(tmp_path, "job.json", json.dumps(SPEC)))) == 0
    submitted = capsys.readouterr().out
    assert submitted.startswith("job      0123456789ab (sweep-a)\nstate    RUNNING\nbackend  leases\n"), submitted
    assert submitted.endswith("follow it: flashruntime logs 0123456789ab --follow; "
                              "flashruntime status 0123456789ab\n"), submitted
    assert run_cli("--api", fake.url, "cancel", "0123456789ab") == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "state    CANCELLED", "backend  leases",
        "cancel requested; flashruntime status 0123456789ab shows when its tasks have stopped"]


def test_events_read_as_a_table_oldest_first(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/0123456789ab/events")] = (200, [
        {"type": "JOB_ACCEPTED", "message": "job sweep-a accepted", "timestamp": "2026-01-01T00:00:00Z"},
        {"type": "TASK_EXHAUSTED", "message": "task task-001 failed for good", "timestamp": "not a time"}])
    assert run_cli("--api", fake.url, "events", "0123456789ab") == 0
    header, first, second = capsys.readouterr().out.splitlines()
    assert header == "AGE   TYPE            MESSAGE"
    assert re.fullmatch(r"\d+d +JOB_ACCEPTED    job sweep-a accepted", first), first
    assert second == "-     TASK_EXHAUSTED  task task-001 failed for good"
    fake.routes[("GET", "/v1alpha1/jobs/0123456789ab/events")] = (200, [])
    assert run_cli("--api", fake.url, "events", "0123456789ab") == 0
    assert capsys.readouterr().out == "no events\n"


def test_job_id_is_one_path_segment(fake: FakeCoordinator, run_cli: Callable[..., int]) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/a%2Fb%3Fx/events")] = (200, [])
    assert run_cli("--api", fake.url, "events", "a/b?x") == 0
    assert fake.requests[0].path == "/v1alpha1/jobs/a%2Fb%3Fx/events"


@pytest.mark.parametrize("command", ["status", "events", "logs", "cancel"])
def test_unknown_job_exits_1_with_status_and_detail(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    for method in ("GET", "POST"):
        for suffix in ("", "/events", "/logs", "/cancel"):
            fake.routes[(method, f"/v1alpha1/jobs/nope{suffix}")] = (404, {"detail": "job 'nope' not found"})
    assert run_cli("--api", fake.url, command, "nope") == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"flashruntime {command}: ")
    assert "-> 404 Not Found: job 'nope' not found" in out.err


def test_server_error_with_a_text_body_exits_1_with_the_text(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/j1")] = (500, b"Internal Server Error")
    assert run_cli("--api", fake.url, "status", "j1") == 1
    assert "-> 500 Internal Server Error: Internal Server Error" in capsys.readouterr().err


def test_empty_job_id_is_a_usage_error(run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli("status", " ")
    assert exit_info.value.code == 2
    assert "job_id must not be empty" in capsys.readouterr().err


# --- unreachable, wrong server --------------------------------------------------


@pytest.mark.parametrize("argv", [["status", "j1"], ["cancel", "j1"], ["submit-spec", "{spec}"]])
def test_closed_port_exits_2_naming_the_url(
    run_cli: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    spec = _write(tmp_path, "job.json", json.dumps(SPEC))
    url = f"http://127.0.0.1:{_closed_port()}"
    assert run_cli("--api", url, *(a.replace("{spec}", str(spec)) for a in argv)) == 2
    err = capsys.readouterr().err
    assert f"cannot reach the coordinator at {url}" in err
    assert "flashruntime serve" in err and "FLASHML_RUNTIME_API" in err


def test_non_json_answer_exits_2(
    fake: FakeCoordinator, run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/j1")] = (200, b"<html>not a coordinator</html>")
    assert run_cli("--api", fake.url, "status", "j1") == 2
    assert "is not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--api", "localhost:8100"], None, "--api 'localhost:8100' is not an http(s) URL"),
    ([], "ftp://x", "FLASHML_RUNTIME_API 'ftp://x' is not an http(s) URL"),
    (["--api", "http://"], None, "--api 'http://' is not an http(s) URL"),
])
def test_api_that_is_not_a_url_exits_2(
    run_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    argv: list[str], env: str | None, message: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("FLASHML_RUNTIME_API", env)
    assert run_cli(*argv, "status", "j1") == 2
    assert message in capsys.readouterr().err


# --- where the URL comes from ---------------------------------------------------


def test_api_flag_beats_env(serve_fake: Callable[[], FakeCoordinator], run_cli: Callable[..., int],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    flag, env = serve_fake(), serve_fake()
    monkeypatch.setenv("FLASHML_RUNTIME_API", env.url)
    run_cli("--api", flag.url + "/", "status", "j1")  # a trailing slash is tolerated
    assert [r.path for r in flag.requests] == ["/v1alpha1/jobs/j1"] and env.requests == []


def test_env_beats_default(serve_fake: Callable[[], FakeCoordinator], run_cli: Callable[..., int],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    env, default = serve_fake(), serve_fake()
    monkeypatch.setattr(_api, "DEFAULT_API", default.url)
    monkeypatch.setenv("FLASHML_RUNTIME_API", env.url)
    run_cli("status", "j1")
    assert len(env.requests) == 1 and default.requests == []


def test_default_is_used_without_flag_or_env(serve_fake: Callable[[], FakeCoordinator], run_cli: Callable[..., int],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    default = serve_fake()
    monkeypatch.setattr(_api, "DEFAULT_API", default.url)
    monkeypatch.setenv("FLASHML_RUNTIME_API", "")  # empty counts as unset
    run_cli("logs", "j1")
    assert [r.path for r in default.requests] == ["/v1alpha1/jobs/j1/logs"]


def test_resolve_api_precedence_and_default() -> None:
    assert _api.DEFAULT_API == "http://localhost:8100"
    env = {"FLASHML_RUNTIME_API": "http://env:1/"}
    assert _api.resolve_api("https://flag:2", env) == "https://flag:2"
    assert _api.resolve_api(None, env) == "http://env:1"
    assert _api.resolve_api(None, {}) == "http://localhost:8100"
    assert _api.resolve_api(None, {"FLASHML_RUNTIME_API": ""}) == "http://localhost:8100"


# --- core install only ----------------------------------------------------------


def test_http_commands_work_with_the_core_install_only(fake: FakeCoordinator, tmp_path: Path) -> None:
    fake.routes[("GET", "/v1alpha1/jobs/j1")] = (200, RECORD)
    spec = _write(tmp_path, "job.yaml", SPEC_YAML)
    code = (
        "from flashruntime.cli import dispatch as cli\n"
        f"cli.COMMAND_MODULES = tuple(m for m in cli.COMMAND_MODULES if m != {JOBS_MODULE!r}) + ({JOBS_MODULE!r},)\n"
        f"status = cli.main(['--api', {fake.url!r}, 'status', 'j1', '--json'])\n"
        f"yaml_spec = cli.main(['--api', {fake.url!r}, 'submit-spec', {str(spec)!r}])\n"
        "print('codes', status, yaml_spec)\n"
    )
    result = run_core_only(code)  # every non-core import (yaml, fastapi, httpx, ...) refused
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "codes 0 2"
    assert json.loads(result.stdout.rsplit("codes", 1)[0]) == RECORD
    assert "pip install pyyaml" in result.stderr
    assert [r.path for r in fake.requests] == ["/v1alpha1/jobs/j1"]
