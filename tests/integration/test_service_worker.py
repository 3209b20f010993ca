"""The built-in worker agent against a stdlib fake coordinator, with real child
processes: registration, heartbeats, claim loop, module and argv payloads, inputs, the
finish (uploads, sha256, evidence), lease loss and shutdown, and the CLI's exit codes.
Stops, drains and restarts are in ``test_worker_stop_and_restart``."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import socket
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashruntime.agent import worker_cli as worker_command
from flashruntime.agent.inputs import TaskRefused, extract_archive
from flashruntime.agent.lease_run import heartbeat_interval
from flashruntime.agent.worker import WorkerAgent, WorkerTiming
from flashruntime.cli import worker as worker_cli
from flashruntime.protocol.v1alpha1 import Lease, utcnow
from tests._support import pid_alive, pids_with_environ_entry, run_core_only
from tests.worker_fake_coordinator import FakeCoordinator

FAST = WorkerTiming(node_heartbeat_s=0.2, term_grace_s=1.0, min_lease_heartbeat_s=0.2, sampler_period_s=0.2,
                    child_poll_s=0.05, max_backoff_s=0.2, finish_attempts=2)
FEDAVG_PARAMS = {"local_steps": 3, "lr": 0.1, "batch_size": 4, "seed": 3, "in_dim": 3, "hidden": 4, "out_dim": 2,
                 "dataset_size": 16, "round": 0, "shard": 0, "num_shards": 2}
CONTRACT = ["FLASHML_OUTPUT_DIR", "FLASHML_CKPT_DIR", "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID", "FLASHML_TASK_ID",
            "FLASHML_INPUTS_FILE"]


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    fake = FakeCoordinator()
    fake.start()
    yield fake
    fake.stop()


def make_agent(coordinator: FakeCoordinator, tmp_path: Path, **kwargs) -> WorkerAgent:
    options = {"node_id": "node-a", "work_dir": tmp_path / "work", "poll_seconds": 0.05, "timing": FAST, **kwargs}
    return WorkerAgent(coordinator.url, **options)


def run_agent(agent: WorkerAgent, timeout: float = 30.0) -> int:
    """run() in this (main) thread, with a watchdog so a bug cannot hang the suite."""
    watchdog = threading.Timer(timeout, agent.stop)
    watchdog.start()
    try:
        return agent.run()
    finally:
        watchdog.cancel()


def argv_payload(code: str, **extra) -> dict:
    return {"argv": [sys.executable, "-c", code], "env": {}, "inputs": {}, "output_prefix": "jobs/job1/task-000/",
            "task_id": "task-000", "image": "local/x:1", "isolation": {"tier": "sandboxed", "allowFallback": True},
            "pool": "team-a", **extra}


def lease_dir(tmp_path: Path, lease_id: str, job: str = "job1", task: str = "task-000") -> Path:
    return tmp_path / "work" / job / task / lease_id


WRITE_METRICS = ("import json, os; "
                 "json.dump({'ok': 1}, open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")


@pytest.mark.torch
def test_module_task_runs_as_subprocess_uploads_outputs_and_completes(coordinator, tmp_path):
    pytest.importorskip("torch")
    prefix = "jobs/job1/shard-000/"
    lease_id = coordinator.add_lease({"module": "flashml_workloads.fedavg_worker", "params": FEDAVG_PARAMS,
                                      "inputs": {}, "output_prefix": prefix, "task_id": "shard-000"},
                                     task_id="shard-000")
    agent = make_agent(coordinator, tmp_path, token="tok-1", join_code="join-1", max_tasks=1, pools=["team-a"],
                       datasets={"imgs": str(tmp_path)})
    assert run_agent(agent) == 0
    assert coordinator.failed == {}
    assert set(coordinator.artifacts) == {prefix + "metrics.json", prefix + "delta.json", prefix + "task.log"}
    metrics = coordinator.artifacts[prefix + "metrics.json"]
    done = coordinator.completed[lease_id]
    assert done["output_sha256"] == hashlib.sha256(metrics).hexdigest()
    assert json.loads(metrics)["samples"] == 8
    assert done["evidence"]["exit_code"] == 0 and done["evidence"]["wall_seconds"] > 0
    assert done["evidence"]["image_digest"] == ""
    root = lease_dir(tmp_path, lease_id, task="shard-000")
    assert json.loads((root / "spec.json").read_text()) == {"task_id": "shard-000", "params": FEDAVG_PARAMS,
                                                            "inputs": {}}
    assert (root / "telemetry.jsonl").is_file() and not (root / "out" / "telemetry.jsonl").exists()
    assert sorted(p.name for p in (root / "out").iterdir()) == ["delta.json", "metrics.json"]
    # registration: the documented capability flags, and the credentials on every call
    reg = coordinator.registrations[0]
    assert reg["node_id"] == "node-a" and reg["kubernetes_node"] == "" and reg["hostname"] == socket.gethostname()
    assert (reg["module_capable"], reg["argv_capable"], reg["sandbox_capable"], reg["unsandboxed_argv_capable"]) \
        == (True, False, False, False)
    assert reg["capabilities"]["pools"] == ["team-a"] and reg["local_datasets"] == ["imgs"]
    assert reg["agent_version"] == "0.5.0" and reg["capabilities"]["cpu_cores"] >= 1
    assert all(r.headers.get("authorization") == "Bearer tok-1" for r in coordinator.requests)
    joins = [r.headers.get("x-flashml-join-code") for r in coordinator.requests]
    assert joins[0] == "join-1" and set(joins[1:]) == {None}


def test_refused_payloads_are_failed_with_reasons_and_never_started(coordinator, tmp_path):
    not_allowed = coordinator.add_lease({"module": "os", "params": {}, "inputs": {}}, task_id="t-mod")
    bare_argv = coordinator.add_lease(argv_payload(WRITE_METRICS), task_id="t-argv")
    agent = make_agent(coordinator, tmp_path, max_tasks=2)
    assert run_agent(agent) == 0
    assert "module 'os' is not in ALLOWED_TASK_MODULES" in coordinator.failed[not_allowed]
    assert "flashml_workloads.fedavg_worker" in coordinator.failed[not_allowed]
    assert coordinator.failed[bare_argv] == ("argv payloads run only on an agent started with --runner sandboxed "
                                             "(tier 'sandboxed') or --runner trusted (this agent: --runner subprocess)")
    assert coordinator.completed == {} and agent.tasks_done == 2
    assert not (lease_dir(tmp_path, not_allowed, task="t-mod") / "launcher.log").exists()
    assert not (lease_dir(tmp_path, bare_argv, task="t-argv") / "launcher.log").exists()


ENV_PROBE = """
import json, os, sys
out = os.environ["FLASHML_OUTPUT_DIR"]
keys = __KEYS__ + ["MINE"]
doc = {"env": {k: os.environ.get(k) for k in keys}, "cwd": os.getcwd(),
       "inputs": json.load(open(os.environ["FLASHML_INPUTS_FILE"])),
       "plain": open(json.load(open(os.environ["FLASHML_INPUTS_FILE"]))["plain"]).read()}
os.makedirs(os.path.join(out, "sub"))
open(os.path.join(out, "sub", "extra.txt"), "w").write("x")
json.dump(doc, open(os.path.join(out, "metrics.json"), "w"))
""".replace("__KEYS__", repr(CONTRACT))


def test_trusted_argv_payload_gets_the_environment_contract(coordinator, tmp_path):
    dataset = tmp_path / "ds"
    dataset.mkdir()
    coordinator.artifacts["data/plain.txt"] = b"hello input"
    lease_id = coordinator.add_lease(argv_payload(
        ENV_PROBE, env={"MINE": "1", "FLASHML_JOB_ID": "spoofed"}, inputs={"plain": "artifact://data/plain.txt"},
        local_inputs=["ds"]))
    agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1, datasets={"ds": str(dataset)})
    assert agent.registration().unsandboxed_argv_capable is True
    assert run_agent(agent) == 0
    root = lease_dir(tmp_path, lease_id).resolve()
    doc = json.loads(coordinator.artifacts["jobs/job1/task-000/metrics.json"])
    assert doc["env"] == {
        "FLASHML_OUTPUT_DIR": str(root / "out"), "FLASHML_CKPT_DIR": str(root.parent / "ckpt"),
        "FLASHML_JOB_ID": "job1", "FLASHML_ATTEMPT_ID": lease_id, "FLASHML_TASK_ID": "task-000",
        "FLASHML_INPUTS_FILE": str(root / "inputs.json"), "MINE": "1"}
    assert doc["cwd"] == str(root)
    assert doc["inputs"] == {"plain": str(root / "inputs" / "plain"), "ds": str(dataset.resolve())}
    assert doc["plain"] == "hello input"
    assert coordinator.artifacts["jobs/job1/task-000/sub/extra.txt"] == b"x"
    assert coordinator.calls("GET", "/v1alpha1/artifacts/data/plain.txt")


def test_failing_child_is_failed_with_exit_code_and_last_log_line(coordinator, tmp_path):
    crash = coordinator.add_lease(argv_payload("import sys; print('starting', flush=True); print('boom: bad thing', "
                                               "file=sys.stderr); sys.exit(3)", output_prefix="jobs/job1/t-crash/"),
                                  task_id="t-crash")
    no_metrics = coordinator.add_lease(argv_payload("print('done, but wrote nothing')",
                                                    output_prefix="jobs/job1/t-empty/"), task_id="t-empty")
    agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=2)
    assert run_agent(agent) == 0
    assert coordinator.failed == {
        crash: "exit 3: boom: bad thing",
        no_metrics: "exit 0 without out/metrics.json: a task must write metrics.json into $FLASHML_OUTPUT_DIR; "
                    "its last line: done, but wrote nothing",
    }
    assert coordinator.completed == {}
    # no output of a failed attempt is kept, but its log is: uploaded before the fail, stdout and stderr
    assert coordinator.artifacts == {"jobs/job1/t-crash/task.log": b"starting\nboom: bad thing\n",
                                     "jobs/job1/t-empty/task.log": b"done, but wrote nothing\n"}


def test_failing_module_reports_the_module_error(coordinator, tmp_path):
    lease_id = coordinator.add_lease({"module": "flashml_workloads.fedavg_worker", "params": {"lr": 0.1},
                                      "inputs": {}})
    assert run_agent(make_agent(coordinator, tmp_path, max_tasks=1)) == 0
    assert coordinator.failed[lease_id].startswith("exit 1: fedavg_worker: ValueError: ")
    assert "missing params" in coordinator.failed[lease_id]


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "pids"), "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def _marked_pids(out_dir: Path) -> list[int]:
    """Every process whose environment carries the attempt's marker, by its pid on this host."""
    return pids_with_environ_entry(b"FLASHML_OUTPUT_DIR=" + os.fsencode(out_dir))


def _wait_for_pids(path: Path, timeout: float = 20.0) -> list[int]:
    """The attempt's processes once its program wrote ``path``, found from outside: a task in
    a pid namespace of its own (the trusted runner's, where bwrap works) knows only its numbering."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) == 2:
            pids = _marked_pids(path.parent.resolve())
            if len(pids) >= 2:
                return pids
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear")


def test_lease_lost_410_stops_every_process_and_abandons_the_lease(coordinator, tmp_path):
    lease_id = coordinator.add_lease(argv_payload(STUBBORN), lease_seconds=0.6)
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    thread = threading.Thread(target=agent.run)  # off the main thread: no signal handlers, stop() ends it
    thread.start()
    try:
        pids = _wait_for_pids(lease_dir(tmp_path, lease_id) / "out" / "pids")
        assert all(pid_alive(pid) for pid in pids)
        with coordinator.lock:
            coordinator.lost.add(lease_id)
        lost_at = time.monotonic()
        assert coordinator.wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=15)
        # both ignore SIGTERM: SIGKILL after the (shortened) grace, well inside the default 10 s
        assert time.monotonic() - lost_at < FAST.term_grace_s + 5
        time.sleep(0.3)
    finally:
        agent.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert lease_id not in coordinator.completed and lease_id not in coordinator.failed
    assert coordinator.calls("POST", f"/v1alpha1/attempts/{lease_id}/heartbeat")[-1].path.endswith("heartbeat")
    after = [r for r in coordinator.requests if lease_id in r.path and r.method != "GET"
             and not r.path.endswith("/heartbeat")]
    assert after == []  # abandoned: no complete, no fail, no upload (the cancel watch only reads)
    assert agent.tasks_done == 0


def test_sigterm_against_a_coordinator_without_the_release_route_fails_the_lease_as_before(coordinator, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv("FLASHML_PREEMPT_GRACE_S", "0.5")
    coordinator.supports_release = False
    lease_id = coordinator.add_lease(argv_payload(STUBBORN))
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    pids: list[int] = []

    def send_sigterm() -> None:
        pids.extend(_wait_for_pids(lease_dir(tmp_path, lease_id) / "out" / "pids"))
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    killer = threading.Thread(target=send_sigterm)
    killer.start()
    assert run_agent(agent) == 0
    killer.join()
    assert signal.getsignal(signal.SIGTERM) is before
    (reason,) = coordinator.failed.values()  # the release was answered 404: failed instead
    assert list(coordinator.failed) == [lease_id] and reason.startswith(f"agent shutdown: {lease_id} preempted"), reason
    assert coordinator.calls("POST", f"/v1alpha1/attempts/{lease_id}/release")
    assert pids and not any(pid_alive(pid) for pid in pids)


def test_node_heartbeat_404_re_registers(coordinator, tmp_path):
    coordinator.node_heartbeat_statuses.append(404)
    agent = make_agent(coordinator, tmp_path)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        assert coordinator.wait_for(lambda: len(coordinator.registrations) >= 2, timeout=10)
        assert coordinator.wait_for(lambda: len(coordinator.calls("POST", r"/v1alpha1/nodes/node-a/heartbeat")) >= 3)
    finally:
        agent.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert len(coordinator.registrations) == 2
    assert coordinator.calls("POST", r"/v1alpha1/nodes/node-a/heartbeat")[0].json()["status"] == "online"


def test_claim_403_re_registers_once_then_backs_off_and_204_sleeps_with_jitter(coordinator, tmp_path):
    coordinator.claim_statuses.extend([403, 403, 403])
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(0.005)

    timing = WorkerTiming(node_heartbeat_s=60, max_backoff_s=100, sleep=sleep)
    agent = make_agent(coordinator, tmp_path, poll_seconds=1.0, timing=timing)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        assert coordinator.wait_for(lambda: len(sleeps) >= 30)
    finally:
        agent.stop()
        thread.join(30)
    assert len(coordinator.registrations) == 2  # the first 403 re-registers; the next ones back off
    assert 1.6 <= sleeps[0] <= 2.4 and 3.2 <= sleeps[1] <= 4.8  # poll * 2, poll * 4, jittered ±20 %
    idle = sleeps[2:]
    assert all(0.8 <= s <= 1.2 for s in idle) and len(set(idle)) > 1


@pytest.mark.parametrize("status, code, tries", [(403, 1, 1), (401, 1, 1), (500, 2, FAST.finish_attempts)])
def test_registration_refused_or_broken(coordinator, tmp_path, status, code, tries):
    """A refusal is final; a coordinator that keeps failing is tried by the client's retry policy."""
    coordinator.register_statuses.extend([status] * FAST.finish_attempts)
    assert make_agent(coordinator, tmp_path).run() == code
    assert len(coordinator.calls("POST", "/v1alpha1/nodes/register")) == tries
    assert coordinator.calls("POST", "/v1alpha1/leases/claim") == []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_coordinator_at_startup_exits_2(tmp_path):
    agent = WorkerAgent(f"http://127.0.0.1:{_closed_port()}", node_id="n", work_dir=tmp_path / "w", timing=FAST)
    assert agent.run() == 2


def test_coordinator_answered_node_id_is_adopted(coordinator, tmp_path):
    coordinator.assigned_node_id = "node-from-token"
    coordinator.add_lease(argv_payload(WRITE_METRICS))
    agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)
    assert run_agent(agent) == 0 and agent.node_id == "node-from-token"
    assert {r.json()["node_id"] for r in coordinator.calls("POST", "/v1alpha1/leases/claim")} == {"node-from-token"}


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            bundle.addfile(info)
    return buffer.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in members.items():
            bundle.writestr(name, data)
    return buffer.getvalue()


LIST_INPUTS = """
import json, os
inputs = json.load(open(os.environ["FLASHML_INPUTS_FILE"]))
found = {name: sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)
         for name, path in inputs.items()}
json.dump(found, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


def test_inputs_are_downloaded_and_archives_unpacked(coordinator, tmp_path):
    coordinator.artifacts["d/data.tgz"] = _tar({"a/b.txt": b"1", "c.txt": b"2"}, links={"a/link": "b.txt"})
    coordinator.artifacts["d/data.zip"] = _zip({"z/one.txt": b"3"})
    lease_id = coordinator.add_lease(argv_payload(
        LIST_INPUTS, inputs={"tgz": "artifact://d/data.tgz", "zipped": "artifact://d/data.zip"},
        unpack_inputs=["tgz", "zipped"]))
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)) == 0
    found = json.loads(coordinator.artifacts["jobs/job1/task-000/metrics.json"])
    assert found == {"tgz": ["a/b.txt", "a/link", "c.txt"], "zipped": ["z/one.txt"]}
    assert sorted(p.name for p in (lease_dir(tmp_path, lease_id) / "inputs").iterdir()) == ["tgz", "zipped"]


@pytest.mark.parametrize("archive, why", [
    (_tar({"ok.txt": b"1", "../evil.txt": b"x"}), "archive member '../evil.txt' escapes"),
    (_tar({"ok.txt": b"1"}, links={"link": "../../.."}), "archive link 'link' -> '../../..' escapes"),
    (_zip({"ok.txt": b"1", "../evil.txt": b"x"}), "archive member '../evil.txt' escapes"),
])
def test_archive_with_an_escaping_member_refuses_the_task(coordinator, tmp_path, archive, why):
    coordinator.artifacts["d/bad"] = archive
    lease_id = coordinator.add_lease(argv_payload(WRITE_METRICS, inputs={"data": "artifact://d/bad"},
                                                  unpack_inputs=["data"]))
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)) == 0
    assert why in coordinator.failed[lease_id] and "input 'data'" in coordinator.failed[lease_id]
    root = lease_dir(tmp_path, lease_id)
    assert not (root / "inputs" / "evil.txt").exists() and not (root / "evil.txt").exists()
    assert list((root / "inputs" / "data").iterdir()) == []  # nothing extracted at all
    assert not (root / "launcher.log").exists()


def test_extract_archive_refuses_absolute_and_device_members(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar({"/etc/evil": b"x"}))
    with pytest.raises(TaskRefused, match="escapes the extraction directory"):
        extract_archive(archive, tmp_path / "dest", "a")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as bundle:
        info = tarfile.TarInfo("fifo")
        info.type = tarfile.FIFOTYPE
        bundle.addfile(info)
    archive.write_bytes(buffer.getvalue())
    with pytest.raises(TaskRefused, match="device or fifo"):
        extract_archive(archive, tmp_path / "dest", "a")
    archive.write_bytes(b"plain text, not an archive")
    with pytest.raises(TaskRefused, match="neither a tar nor a zip"):
        extract_archive(archive, tmp_path / "dest", "a")


def test_missing_artifact_and_unknown_local_dataset_fail_the_task(coordinator, tmp_path):
    missing = coordinator.add_lease(argv_payload(WRITE_METRICS, inputs={"x": "artifact://nope/x"}), task_id="t1")
    unknown = coordinator.add_lease(argv_payload(WRITE_METRICS, local_inputs=["imagenet"]), task_id="t2")
    unsafe = coordinator.add_lease(argv_payload(WRITE_METRICS), task_id="..")
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=3)) == 0
    assert coordinator.failed[missing].startswith("input 'x': download of artifact 'nope/x' failed: HTTP 404")
    assert coordinator.failed[unknown].startswith("local input 'imagenet' is not a dataset of this agent")
    assert coordinator.failed[unsafe].startswith("task id '..' is not usable as a directory name")


def test_max_tasks_stops_the_claim_loop(coordinator, tmp_path):
    for index in range(3):
        coordinator.add_lease(argv_payload(WRITE_METRICS), task_id=f"task-{index:03d}")
    agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=2)
    assert run_agent(agent) == 0
    assert len(coordinator.completed) == 2 and len(coordinator.queued) == 1 and agent.tasks_done == 2
    assert len(coordinator.calls("POST", "/v1alpha1/leases/claim")) == 2


# CLI ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashruntime")
    parser.add_argument("--api", default=None)
    worker_cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_parses_every_option(tmp_path):
    args = _parser().parse_args([
        "worker", "--coordinator", "http://c:1", "--token", "t", "--node-id", "n", "--join-code", "j",
        "--runner", "trusted", "--max-tasks", "3", "--work-dir", str(tmp_path), "--poll-seconds", "0.5",
        "--pools", "a,b", "--dataset", f"one={tmp_path}", "--dataset", f"two={tmp_path}"])
    assert (args.coordinator, args.token, args.node_id, args.join_code, args.runner, args.max_tasks) == \
        ("http://c:1", "t", "n", "j", "trusted", 3)
    assert (args.work_dir, args.poll_seconds, args.pools) == (str(tmp_path), 0.5, "a,b")
    assert worker_command.parse_datasets(args.dataset) == {"one": str(tmp_path), "two": str(tmp_path)}
    assert args.handler is worker_command.handle
    defaults = _parser().parse_args(["worker"])
    # No --runner: the worker picks the sandbox where bubblewrap works, else subprocess, at start.
    assert (defaults.runner, defaults.max_tasks, defaults.poll_seconds, defaults.dataset) == (None, 0, 2.0, [])
    assert defaults.drain is False and _parser().parse_args(["worker", "--drain"]).drain is True


def test_cli_coordinator_resolution(monkeypatch):
    parser = _parser()
    monkeypatch.delenv("FLASHML_RUNTIME_API", raising=False)
    assert worker_command.resolve_coordinator(parser.parse_args(["worker"])) == "http://localhost:8100"
    monkeypatch.setenv("FLASHML_RUNTIME_API", "http://env:1")
    assert worker_command.resolve_coordinator(parser.parse_args(["worker"])) == "http://env:1"
    assert worker_command.resolve_coordinator(parser.parse_args(["--api", "http://api:2", "worker"])) == "http://api:2"
    assert worker_command.resolve_coordinator(
        parser.parse_args(["--api", "http://api:2", "worker", "--coordinator", "http://c:3"])) == "http://c:3"


def test_cli_takes_token_and_join_code_from_the_environment_and_exits_1_when_refused(coordinator, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("FLASHML_NODE_TOKEN", "env-token")
    monkeypatch.setenv("FLASHML_JOIN_CODE", "env-join")
    coordinator.register_statuses.append(403)
    args = _parser().parse_args(["worker", "--coordinator", coordinator.url, "--work-dir", str(tmp_path)])
    assert args.handler(args) == 1
    (register,) = coordinator.requests
    assert register.headers["authorization"] == "Bearer env-token"
    assert register.headers["x-flashml-join-code"] == "env-join"


@pytest.mark.parametrize("argv", [
    ["--dataset", "no-equals-sign"], ["--dataset", "x=/definitely/not/here"], ["--max-tasks", "-1"],
    ["--poll-seconds", "0"], ["--coordinator", "ftp://nope"],
])
def test_cli_invalid_options_exit_2(tmp_path, argv, capsys):
    args = _parser().parse_args(["worker", "--work-dir", str(tmp_path), *argv])
    assert args.handler(args) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_cli_unreachable_coordinator_exits_2_and_bad_runner_is_a_usage_error(tmp_path):
    args = _parser().parse_args(["worker", "--coordinator", f"http://127.0.0.1:{_closed_port()}",
                                 "--work-dir", str(tmp_path)])
    assert args.handler(args) == 2
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["worker", "--runner", "docker"])
    assert exc.value.code == 2


def test_worker_imports_and_registers_with_the_standard_library_only():
    result = run_core_only(
        "import sys, flashruntime.agent.worker as w, flashruntime.cli.worker\n"
        "reg = w.WorkerAgent('http://127.0.0.1:1', node_id='n').registration()\n"
        "assert reg.capabilities.cpu_cores and reg.capabilities.memory_bytes, reg\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'httpx', 'psutil', 'yaml', 'torch') if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.service
@pytest.mark.torch
def test_against_the_real_coordinator_a_module_trial_commits_and_a_broken_one_fails(tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    pytest.importorskip("torch")
    from tests.service_server import serve_in_thread, settings_for

    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "worker-agent"},
           "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                    "workload": {"type": "hyperparameter_search",
                                 "parameters": {"module": "fedavg_worker", "trials": [FEDAVG_PARAMS, {"lr": 0.1}]}},
                    "retryPolicy": {"maxTaskAttempts": 1}}}
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        created = httpx.post(f"{url}/v1alpha1/jobs", json=job, timeout=10)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        agent = WorkerAgent(url, node_id="node-real", work_dir=tmp_path / "work", max_tasks=2, poll_seconds=0.05,
                            timing=FAST)
        assert run_agent(agent, timeout=60) == 0
        tasks = {t["task_id"]: t for t in httpx.get(f"{url}/v1alpha1/jobs/{job_id}/tasks", timeout=10).json()}
        assert tasks["trial-000"]["state"] == "COMPLETED" and tasks["trial-001"]["state"] == "FAILED"
        assert tasks["trial-000"]["evidence"]["exit_code"] == 0
        keys = {a["key"] for a in httpx.get(f"{url}/v1alpha1/jobs/{job_id}/artifacts", timeout=10).json()}
        assert {f"jobs/{job_id}/trial-000/metrics.json", f"jobs/{job_id}/trial-000/delta.json"} <= keys
        events = httpx.get(f"{url}/v1alpha1/jobs/{job_id}/events", timeout=10).json()
        failed = [e["message"] for e in events if e["type"] == "TASK_ATTEMPT_FAILED"]
        assert len(failed) == 1 and failed[0].startswith("exit 1: fedavg_worker: ValueError: ")
        nodes = httpx.get(f"{url}/v1alpha1/nodes", timeout=10).json()
        assert [(n["node_id"], n["accepted_tasks"]) for n in nodes] == [("node-real", 1)]


def test_registration_lists_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H200, 3, 10, 143771\\nNVIDIA H200, [N/A], 0, [N/A]\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    gpus = WorkerAgent("http://127.0.0.1:1", node_id="n").registration().model_dump()["capabilities"]["gpus"]
    assert gpus == [
        {"index": 0, "name": "NVIDIA H200", "memory_total_mb": 143771, "driver_version": "", "compute_capability": ""},
        {"index": 1, "name": "NVIDIA H200", "memory_total_mb": None, "driver_version": "", "compute_capability": ""},
    ]


def test_lease_heartbeat_period_is_a_third_of_the_lease_with_a_one_second_floor():
    def lease(seconds: float) -> Lease:
        return Lease(lease_id="ls-1", task_id="t", job_id="j", node_id="n", attempt_number=1, deadline=utcnow(),
                     lease_seconds=seconds)

    assert heartbeat_interval(lease(90.0)) == 30.0
    assert heartbeat_interval(lease(0.0)) == 20.0  # not stated by the sender: 60 s
    assert heartbeat_interval(lease(1.5)) == 1.0
