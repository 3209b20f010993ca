"""Workers that stop, drain and die, end to end: ``flashruntime serve`` and real ``flashruntime
worker`` processes, real signals, ``kill -9`` for real. A proxy in front of the coordinator
(``tests.fault_proxy``) holds one request so that a SIGTERM lands at a chosen moment:
registering, between tasks (a claim on its way back), uploading, completing.

Every job allows one failure (``maxTaskAttempts: 1``): a stopped worker's task must still
complete, on another worker, with its failure count at 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests._support import pid_alive, pids_with_environ_entry, wait_until
from tests.fault_proxy import HoldingProxy
from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = [pytest.mark.service, pytest.mark.skipif(sys.platform != "linux", reason="/proc, signals, kill -9")]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

CONSOLE_SCRIPT = Path(sys.executable).with_name("flashruntime")

# A task: argv = markers dir, task index, mode. It logs "start <attempt> <pid> alive=<pids of
# earlier attempts still alive>" and "end <attempt> <pid>" to markers/log, records its pid and
# its child's (a session of its own, as torchrun's ranks are) in markers/<attempt>.pids, and
# in mode "wait-first" its first attempt waits for markers/go-<index> before it finishes.
TASK = r"""
import json, os, subprocess, sys, time
markers, index, mode = sys.argv[1], sys.argv[2], sys.argv[3]
attempt, me = os.environ["FLASHML_ATTEMPT_ID"], os.getpid()

def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

def log(line):
    with open(os.path.join(markers, "log"), "a") as handle:
        handle.write(line + "\n")

# Pids mean something only in the pid namespace they were written in (the trusted runner
# gives each attempt its own): an earlier attempt's are checked only when it shared ours.
namespace = os.readlink("/proc/self/ns/pid")
earlier = []
for name in sorted(os.listdir(markers)):
    if name.endswith(".pids"):
        written_in, *pids = open(os.path.join(markers, name)).read().split()
        earlier += pids if written_in == namespace else []
log(f"start {attempt} {me} alive={','.join(p for p in earlier if alive(int(p))) or '-'}")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.path.join(markers, attempt + ".pids.tmp"), "w") as handle:
    handle.write(f"{namespace} {me} {child.pid}")
os.replace(os.path.join(markers, attempt + ".pids.tmp"), os.path.join(markers, attempt + ".pids"))
first = os.path.join(markers, f"first-{index}")
if mode == "wait-first" and not os.path.exists(first):
    open(first, "w").close()
    while not os.path.exists(os.path.join(markers, f"go-{index}")):
        time.sleep(0.05)
child.terminate()
child.wait()
log(f"end {attempt} {me}")
json.dump({"index": int(index)}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("serve") / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(CONSOLE_SCRIPT), "serve", "--port", str(port), "--data-dir", str(data)],
                              env=process_env(FLASHML_SWEEP_INTERVAL_S="0.2"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, process=server)
        yield url
    finally:
        stop_process(server)


class Worker:
    """A real ``flashruntime worker`` process; its output goes to a file beside its work dir."""

    def __init__(self, url: str, node_id: str, work_dir: Path, pool: str, *extra: str,
                 path: str | None = None) -> None:
        self.work_dir = work_dir
        self.log_path = work_dir.with_name(work_dir.name + ".log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(CONSOLE_SCRIPT), "--api", url, "worker", "--node-id", node_id, "--work-dir", str(work_dir),
                 "--poll-seconds", "0.2", "--runner", "trusted", "--pools", pool, *extra],
                env=process_env(**({} if path is None else {"PATH": path})), stdout=log, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_line(self, text: str) -> None:
        wait_until(lambda: text in self.log or self.process.poll() is not None, f"{text!r} in the worker's log", 60)
        assert text in self.log, self.log

    def exit_code(self) -> int:
        try:
            return self.process.wait(timeout=90)  # a hang guard
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the worker did not exit:\n{self.log}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


@pytest.fixture
def proxies() -> Iterator[list[HoldingProxy]]:
    started: list[HoldingProxy] = []
    yield started
    for proxy in started:
        proxy.stop()


def submit(url: str, tmp_path: Path, pool: str, tasks: int, mode: str) -> tuple[str, Path]:
    """A command job of ``tasks`` tasks in ``pool`` (one failure allowed each) → (job id, markers dir)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "task.py"
    script.write_text(TASK)
    spec = {"metadata": {"name": pool}, "spec": {
        "workload": {"type": "command", "parameters": {
            "command": [sys.executable, str(script), str(markers), "{i}", mode],
            "task_params": [{"i": i} for i in range(tasks)]}},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": pool},
        "retryPolicy": {"maxTaskAttempts": 1}}}
    created = httpx.post(f"{url}/v1alpha1/jobs", json=spec, timeout=30)
    assert created.status_code == 201, created.text
    return created.json()["job_id"], markers


def tasks_of(url: str, job_id: str) -> dict[str, dict[str, Any]]:
    return {t["task_id"]: t for t in httpx.get(f"{url}/v1alpha1/jobs/{job_id}/tasks", timeout=30).json()}


def finished(url: str, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120  # a hang guard
    while (job := httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=30).json())["state"] in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def events_of(url: str, job_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/v1alpha1/jobs/{job_id}/events", timeout=30).json()


def goodput_of(url: str, job_id: str) -> dict[str, Any]:
    """``flashruntime goodput JOB --json``: the job's ledger, from its events."""
    shown = subprocess.run([str(CONSOLE_SCRIPT), "goodput", job_id, "--json", "--api", url], env=process_env(),
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def seconds_between(events: list[dict[str, Any]], first: tuple[str, str], then: tuple[str, str]) -> float:
    """Seconds from the event of type ``first[0]`` for lease ``first[1]`` to the one of ``then``."""
    def at(kind: str, lease_id: str) -> datetime:
        (stamp,) = [e["timestamp"] for e in events if e["type"] == kind and e["data"].get("lease_id") == lease_id]
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return (at(*then) - at(*first)).total_seconds()


def log_lines(markers: Path) -> list[list[str]]:
    path = markers / "log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def attempt_pids(markers: Path, attempt: str) -> list[int]:
    """The attempt's task and its child once the task wrote its pid file, found from outside:
    a task in a pid namespace of its own (the trusted runner's, where bwrap works) knows only
    its own numbering, so the pids it writes say nothing on this host."""
    path = markers / f"{attempt}.pids"
    wait_until(path.exists, f"{path.name}")
    marker = b"FLASHML_ATTEMPT_ID=" + attempt.encode()
    wait_until(lambda: len(pids_with_environ_entry(marker)) >= 2, f"the processes of {attempt}")
    return pids_with_environ_entry(marker)


def pool_name() -> str:
    return f"faults-{uuid.uuid4().hex[:8]}"


# Where bubblewrap works a trusted task runs in a pid namespace that dies with its worker; a
# worker that cannot find bwrap (a PATH without it) runs plain children, which outlive a
# kill -9 and are what the restart's sweep must stop.
@pytest.mark.parametrize("confinement", ["namespace", "plain"])
def test_kill9_then_restart_sweeps_the_old_attempt_and_the_task_never_runs_twice_at_once(
        coordinator: str, tmp_path: Path, workers: list[Worker], confinement: str) -> None:
    if confinement == "namespace" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
    path = None if confinement == "namespace" else os.path.dirname(sys.executable)
    pool = pool_name()
    job_id, markers = submit(coordinator, tmp_path, pool, tasks=1, mode="wait-first")
    work = tmp_path / "work"
    first = Worker(coordinator, "w-restart", work, pool, path=path)
    workers.append(first)
    wait_until(lambda: log_lines(markers), "the first attempt to start", 60)
    old_attempt = log_lines(markers)[0][1]
    old_pids = attempt_pids(markers, old_attempt)
    assert all(pid_alive(pid) for pid in old_pids)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    if confinement == "plain":
        assert all(pid_alive(pid) for pid in old_pids)  # what a killed worker leaves: the task runs on
    else:
        wait_until(lambda: not any(pid_alive(pid) for pid in old_pids), "the namespace to die with its worker", 30)

    restarted = Worker(coordinator, "w-restart", work, pool, "--max-tasks", "1", path=path)
    workers.append(restarted)
    restarted_at = time.monotonic()
    wait_until(lambda: not any(pid_alive(pid) for pid in old_pids), "the old attempt's processes to end", 30)
    assert time.monotonic() - restarted_at < 5.0, "the restart left the old attempt running for 5 s"
    assert restarted.exit_code() == 0, restarted.log
    assert finished(coordinator, job_id)["state"] == "SUCCEEDED"

    lines = log_lines(markers)
    assert [line[0] for line in lines] == ["start", "start", "end"], lines
    new_attempt = lines[1][1]
    assert new_attempt != old_attempt and lines[2][1] == new_attempt
    assert lines[1][3] == "alive=-", f"the old attempt was still running when the new one started: {lines}"
    (task,) = tasks_of(coordinator, job_id).values()
    assert (task["state"], task["attempts"], task["failures"], task["expiries"]) == ("COMPLETED", 2, 0, 1)
    expired = [e for e in events_of(coordinator, job_id) if e["type"] == "LEASE_EXPIRED"]
    assert [(e["data"]["lease_id"], e["data"]["abandoned"]) for e in expired] == [(old_attempt, True)]
    if confinement == "plain":
        assert "stopped what an earlier worker in this work directory left running" in restarted.log
        # The restart stopped the old attempt before it started the new one.
        assert restarted.log.index("stopped what an earlier worker") < restarted.log.index(f"lease {new_attempt}")
    assert "reported abandoned" in restarted.log

    # The goodput ledger tells it from the events: the abandoned attempt is lost work, and its
    # recovery runs from its last heartbeat to the report, then to the task's next claim.
    ledger, events = goodput_of(coordinator, job_id), events_of(coordinator, job_id)
    assert (ledger["attempts"], ledger["committed"], ledger["running"]) == (2, 1, 0)
    (recovery,) = ledger["recoveries"]
    assert (recovery["lease_id"], recovery["cause"], recovery["node_id"]) == (old_attempt, "abandoned", "w-restart")
    assert recovery["mttr_s"] == pytest.approx(
        seconds_between(events, ("LEASE_EXPIRED", old_attempt), ("LEASE_CLAIMED", new_attempt)), abs=1e-6)
    assert 0 < ledger["goodput"] < 1 and ledger["lost_work_s"] > 0
    shown = subprocess.run([str(CONSOLE_SCRIPT), "goodput", job_id, "--api", coordinator], env=process_env(),
                           capture_output=True, text=True, timeout=120, check=False)
    print(shown.stdout)
    assert shown.stdout.splitlines()[:2] == [
        f"job {job_id} (SUCCEEDED)",
        f"  recovery  task-000 lease {old_attempt} on w-restart abandoned: MTTD {recovery['mttd_s']:.2f} s (from its "
        f"last heartbeat), MTTR {recovery['mttr_s']:.2f} s (to the next claim on w-restart)"]


def test_sigterm_during_a_task_releases_it_and_another_worker_completes_it(
        coordinator: str, tmp_path: Path, workers: list[Worker]) -> None:
    pool = pool_name()
    job_id, markers = submit(coordinator, tmp_path, pool, tasks=1, mode="wait-first")
    first = Worker(coordinator, "w-term-task-1", tmp_path / "work1", pool)
    workers.append(first)
    wait_until(lambda: log_lines(markers), "the task to start", 60)
    pids = attempt_pids(markers, log_lines(markers)[0][1])
    first.process.send_signal(signal.SIGTERM)
    assert first.exit_code() == 0, first.log
    assert not any(pid_alive(pid) for pid in pids)
    (task,) = tasks_of(coordinator, job_id).values()
    assert (task["state"], task["failures"], task["released"]) == ("PENDING", 0, 1)

    second = Worker(coordinator, "w-term-task-2", tmp_path / "work2", pool, "--max-tasks", "1")
    workers.append(second)
    assert second.exit_code() == 0, second.log
    assert finished(coordinator, job_id)["state"] == "SUCCEEDED"
    (task,) = tasks_of(coordinator, job_id).values()
    assert (task["state"], task["node_id"], task["failures"], task["released"]) == (
        "COMPLETED", "w-term-task-2", 0, 1)
    released = [e for e in events_of(coordinator, job_id) if e["type"] == "LEASE_RELEASED"]
    (reason,) = [e["data"]["reason"] for e in released]
    # The release says why: a preemption notice forwarded to the task, and nothing saved to hand over.
    assert reason.startswith("agent shutdown: ") and "preempted by SIGTERM" in reason, reason
    assert reason.endswith("it kept no verified checkpoint to hand over"), reason
    (recovery,) = goodput_of(coordinator, job_id)["recoveries"]
    assert (recovery["cause"], recovery["node_id"], recovery["next_node_id"]) == (
        "released", "w-term-task-1", "w-term-task-2")


@pytest.mark.parametrize(("moment", "method", "path", "skip"), [
    ("between tasks", "POST", r"/v1alpha1/leases/claim", 1),  # the claim after the first task
    ("uploading", "PUT", r"/v1alpha1/artifacts/jobs/.*/task-000/metrics\.json", 0),
])
def test_sigterm_between_tasks_or_while_uploading_exits_0_and_the_task_completes_elsewhere(
        coordinator: str, tmp_path: Path, workers: list[Worker], proxies: list[HoldingProxy],
        moment: str, method: str, path: str, skip: int) -> None:
    pool = pool_name()
    job_id, _ = submit(coordinator, tmp_path, pool, tasks=2 if moment == "between tasks" else 1, mode="quick")
    proxy = HoldingProxy(coordinator).start()
    proxies.append(proxy)
    held = proxy.hold(method, path, after=skip)
    first = Worker(proxy.url, "w-moment-1", tmp_path / "work1", pool)
    workers.append(first)
    held.wait_arrived()
    first.process.send_signal(signal.SIGTERM)
    first.wait_for_line("received SIGTERM: stopping")
    held.let_go()
    assert first.exit_code() == 0, first.log
    given_back = "task-001" if moment == "between tasks" else "task-000"
    task = tasks_of(coordinator, job_id)[given_back]
    assert (task["state"], task["failures"], task["released"]) == ("PENDING", 0, 1), (moment, task)

    second = Worker(coordinator, "w-moment-2", tmp_path / "work2", pool, "--max-tasks", "1")
    workers.append(second)
    assert second.exit_code() == 0, second.log
    assert finished(coordinator, job_id)["state"] == "SUCCEEDED"
    task = tasks_of(coordinator, job_id)[given_back]
    assert (task["node_id"], task["failures"], task["released"]) == ("w-moment-2", 0, 1)
    assert all(t["failures"] == 0 for t in tasks_of(coordinator, job_id).values())


def test_sigterm_while_registering_or_completing_exits_0(
        coordinator: str, tmp_path: Path, workers: list[Worker], proxies: list[HoldingProxy]) -> None:
    pool = pool_name()
    proxy = HoldingProxy(coordinator).start()
    proxies.append(proxy)
    registering = proxy.hold("POST", r"/v1alpha1/nodes/register")
    idle = Worker(proxy.url, "w-registering", tmp_path / "work0", pool)
    workers.append(idle)
    registering.wait_arrived()
    idle.process.send_signal(signal.SIGTERM)
    idle.wait_for_line("received SIGTERM: stopping")
    registering.let_go()
    assert idle.exit_code() == 0, idle.log
    assert ("POST", "/v1alpha1/leases/claim") not in proxy.requests

    job_id, _ = submit(coordinator, tmp_path, pool, tasks=1, mode="quick")
    completing = proxy.hold("POST", r"/v1alpha1/attempts/[^/]+/complete")
    worker = Worker(proxy.url, "w-completing", tmp_path / "work1", pool)
    workers.append(worker)
    completing.wait_arrived()
    worker.process.send_signal(signal.SIGTERM)
    worker.wait_for_line("received SIGTERM: stopping")
    completing.let_go()
    assert worker.exit_code() == 0, worker.log
    assert finished(coordinator, job_id)["state"] == "SUCCEEDED"  # the commit it had sent stands
    (task,) = tasks_of(coordinator, job_id).values()
    assert (task["node_id"], task["failures"], task["released"]) == ("w-completing", 0, 0)


def test_drain_finishes_the_running_task_then_exits_and_a_second_worker_in_its_dir_is_refused(
        coordinator: str, tmp_path: Path, workers: list[Worker]) -> None:
    pool = pool_name()
    job_id, markers = submit(coordinator, tmp_path, pool, tasks=2, mode="wait-first")
    work = tmp_path / "work"
    first = Worker(coordinator, "w-drain", work, pool)
    workers.append(first)
    wait_until(lambda: log_lines(markers), "the first task to start", 60)

    def flashruntime(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CONSOLE_SCRIPT), *args], env=process_env(), capture_output=True, text=True,
                              timeout=120, check=False)

    twin = flashruntime("--api", coordinator, "worker", "--node-id", "w-twin", "--work-dir", str(work))
    assert twin.returncode == 2
    assert f"work directory {work} is in use by another worker (pid {first.process.pid}, node w-drain)" in twin.stderr

    drain = flashruntime("worker", "--drain", "--work-dir", str(work))
    assert drain.returncode == 0, drain.stderr
    assert drain.stdout == (f"worker pid {first.process.pid}, node w-drain in {work} is draining: it finishes its "
                            "current task, then exits\n")
    first.wait_for_line("received SIGUSR1: draining")
    (markers / "go-0").touch()
    assert first.exit_code() == 0, first.log
    assert "node w-drain drained after 1 task(s)" in first.log
    tasks = tasks_of(coordinator, job_id)
    assert (tasks["task-000"]["state"], tasks["task-000"]["node_id"]) == ("COMPLETED", "w-drain")
    assert tasks["task-001"]["state"] == "PENDING" and tasks["task-001"]["attempts"] == 0  # never claimed
    assert flashruntime("worker", "--drain", "--work-dir", str(work)).returncode == 1  # none runs there now

    second = Worker(coordinator, "w-after-drain", tmp_path / "work2", pool, "--max-tasks", "1")
    workers.append(second)
    (markers / "go-1").touch()
    assert second.exit_code() == 0, second.log
    assert finished(coordinator, job_id)["state"] == "SUCCEEDED"
    assert all(t["released"] == 0 and t["failures"] == 0 for t in tasks_of(coordinator, job_id).values())
