"""An attempt's child that leaves its process group and clears its environment (``setsid`` +
``execve`` with an empty environment) is still stopped with the attempt: by a cancel of its
job, the worker's SIGTERM, a ``kill -9`` of the worker plus a restart in the same work
directory, and under ``flash.submit`` by a cancel or the attempt's end. Real coordinator
(uvicorn on 127.0.0.1), real ``flashruntime worker`` processes, real cgroups where the
machine has them. "Gone within 5 s" is polled for 5 s; the measured seconds are printed."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.state import AttemptEntry, AttemptJournal
from flashruntime.launchers.containment import AttemptCgroup, ContainmentKind, containment
from flashruntime.launchers.local import spawn_contained
from tests._support import REPO_ROOT, pid_alive, wait_until
from tests.service_server import CoordinatorProcess, process_env, stop_process

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process containers"),
              pytest.mark.service]

ESCAPEE = Path(__file__).with_name("escapee_task.py")
GONE_WITHIN_S = 5.0  # the acceptance figure


def escapee_pids(token: str) -> set[int]:
    """Host pids of the escapee carrying ``token`` (found by command line, so a pid namespace
    the task runs in does not hide it)."""
    needle = f"# escapee {token}".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes() and pid_alive(int(entry.name)):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def seconds_until_gone(pids: set[int], what: str, limit_s: float = GONE_WITHIN_S) -> float:
    """Poll until none of ``pids`` is alive (up to ``limit_s``); the seconds it took, printed."""
    started = time.monotonic()
    while any(pid_alive(pid) for pid in pids) and time.monotonic() - started < limit_s:
        time.sleep(0.02)
    took = time.monotonic() - started
    alive = {pid for pid in pids if pid_alive(pid)}
    print(f"escapee {sorted(pids)} after {what}: {'gone' if not alive else 'ALIVE'} in {took:.2f} s")
    assert not alive, f"escapee {sorted(alive)} still alive {limit_s:g} s after {what}"
    return took


def wait_for_escapee(token: str, *, worker: subprocess.Popen[Any] | None = None, log: Path | None = None) -> set[int]:
    def running() -> bool:
        if worker is not None and worker.poll() is not None:
            raise AssertionError(f"the worker exited {worker.returncode}: {log.read_text() if log else ''}")
        return bool(escapee_pids(token))

    wait_until(running, "the escapee to start", timeout=60)
    return escapee_pids(token)


def command_job(command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "escapee"},
        "spec": {
            "execution": {"backend": "leases"}, "image": {"repository": "local/train", "tag": "1"},
            # A short lease: the worker hears of the cancel at its next heartbeat, a second away.
            "workload": {"type": "command", "parameters": {"command": command, "lease_seconds": 3}},
            # The trusted runner takes sandboxed-tier commands through the team-pool waiver.
            "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-a"},
            "retryPolicy": {"maxTaskAttempts": 1},
        },
    }


class Fleet:
    """A coordinator process and the workers started against it in one work directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.work_dir = tmp_path / "work"
        self.hints = tmp_path / "hints"
        self.hints.mkdir()
        self.coordinator = CoordinatorProcess(tmp_path / "data").start()
        self.workers: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.tokens: list[str] = []

    def start_worker(self) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp_path / f"worker-{len(self.workers)}.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", self.coordinator.url, "worker", "--work-dir",
                 str(self.work_dir), "--poll-seconds", "0.2", "--runner", "trusted", "--node-id", "box-1",
                 "--pools", "team-a"],
                env=process_env(), stdout=out, stderr=subprocess.STDOUT)
        self.workers.append((worker, log))
        return worker, log

    def submit_escapee(self, token: str) -> str:
        import httpx

        self.tokens.append(token)
        job = command_job([sys.executable, str(ESCAPEE), token, str(self.hints)])
        answer = httpx.post(f"{self.coordinator.url}/v1alpha1/jobs", json=job, timeout=30)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["job_id"])

    def cancel(self, job_id: str) -> None:
        import httpx

        answer = httpx.post(f"{self.coordinator.url}/v1alpha1/jobs/{job_id}/cancel", timeout=30)
        assert answer.status_code == 200, answer.text

    def journaled_cgroup(self) -> str | None:
        entries = AttemptJournal(self.work_dir).entries()
        return entries[0].cgroup if entries else None

    def close(self) -> None:
        for worker, _ in self.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        self.coordinator.stop()
        for token in self.tokens:  # a failed test leaves no escapee behind
            for pid in escapee_pids(token):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    fleet = Fleet(tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()


def check_contained(fleet: Fleet, pids: set[int], log: Path) -> str | None:
    """Where attempts run in cgroups: the journal names the attempt's cgroup and the escapee
    is in it. The worker's start-up line says which containment is in force. → the cgroup."""
    wait_until(lambda: "containment " in log.read_text(), "the worker's start-up line")
    line = next(line for line in log.read_text().splitlines() if "registered with" in line)
    assert "containment " in line
    if "containment cgroup v2" not in line:
        return None
    wait_until(lambda: fleet.journaled_cgroup() is not None, "the attempt's cgroup in the journal")
    cgroup = fleet.journaled_cgroup()
    assert cgroup is not None and Path(cgroup).parent.name == "flashruntime"
    members = {int(pid) for pid in (Path(cgroup) / "cgroup.procs").read_text().split()}
    assert pids <= members, (pids, members)
    return cgroup


def test_a_cancel_of_the_job_ends_the_escapee(fleet: Fleet) -> None:
    worker, log = fleet.start_worker()
    token = secrets.token_hex(8)
    job_id = fleet.submit_escapee(token)
    pids = wait_for_escapee(token, worker=worker, log=log)
    cgroup = check_contained(fleet, pids, log)
    fleet.cancel(job_id)
    seconds_until_gone(pids, "the job's cancel")
    if cgroup is not None:
        wait_until(lambda: not os.path.exists(cgroup), "the attempt's cgroup to be removed")
    assert worker.poll() is None  # the worker itself goes on
    stop_process(worker)  # type: ignore[arg-type]


def test_the_workers_sigterm_ends_the_escapee(fleet: Fleet) -> None:
    worker, log = fleet.start_worker()
    token = secrets.token_hex(8)
    fleet.submit_escapee(token)
    pids = wait_for_escapee(token, worker=worker, log=log)
    cgroup = check_contained(fleet, pids, log)
    worker.send_signal(signal.SIGTERM)
    seconds_until_gone(pids, "the worker's SIGTERM")
    assert worker.wait(timeout=60) == 0, log.read_text()
    if cgroup is not None:
        assert not os.path.exists(cgroup)
    assert AttemptJournal(fleet.work_dir).entries() == []


def test_kill_9_of_the_worker_and_a_restart_end_the_escapee(fleet: Fleet) -> None:
    worker, log = fleet.start_worker()
    token = secrets.token_hex(8)
    fleet.submit_escapee(token)
    pids = wait_for_escapee(token, worker=worker, log=log)
    cgroup = check_contained(fleet, pids, log)
    if cgroup is None:
        # A subreaper dies with its worker, and the orphans go to init: only a cgroup, which
        # outlives the worker, still holds them for the restart.
        pytest.skip("attempts are not in cgroups here, and nothing else outlives a kill -9 of the worker")
    worker.kill()
    worker.wait()
    restarted, restart_log = fleet.start_worker()
    seconds_until_gone(pids, "kill -9 of the worker and a restart")
    wait_until(lambda: not os.path.exists(cgroup), "the restart to remove the attempt's cgroup")
    wait_until(lambda: "registered with" in restart_log.read_text(), "the restarted worker to register")
    stop_process(restarted)  # type: ignore[arg-type]


needs_cgroups = pytest.mark.skipif(containment().kind is not ContainmentKind.CGROUP,
                                   reason=f"attempts are not contained by cgroups here: {containment().reason}")


@needs_cgroups
def test_a_restart_ends_a_journaled_cgroup_whatever_its_processes_carry(fleet: Fleet) -> None:
    """What the restart sweeps by: the cgroup alone (no marker, no process group of the attempt's)."""
    assert containment().parent is not None
    cgroup = AttemptCgroup.create(containment().parent, "leftover")
    token = secrets.token_hex(8)
    leader = spawn_contained([sys.executable, str(ESCAPEE), token, str(fleet.hints)], cgroup, cwd=fleet.tmp_path,
                             env={}, stdout=subprocess.DEVNULL)
    pids = wait_for_escapee(token)
    journal = AttemptJournal(fleet.work_dir)
    journal.add(AttemptEntry("ls-gone", "job-gone", "task-000", "box-0", str(fleet.tmp_path / "nowhere" / "out"),
                             None, os.fsdecode(cgroup.path)))
    restarted, log = fleet.start_worker()
    seconds_until_gone(pids | {leader.pid}, "a restart of a worker whose journal names the cgroup")
    leader.wait(timeout=30)
    wait_until(lambda: not cgroup.path.exists(), "the cgroup to be removed")
    wait_until(lambda: "lease ls-gone" in log.read_text(), "the restart's report of the old lease")
    stop_process(restarted)  # type: ignore[arg-type]


# flash.submit: the driver in a process of its own, as a training script runs it.
SUBMIT = f"""
import json, os, sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
import flashruntime as flash
escapee, token, hints, out, how = sys.argv[1:6]
argv = [sys.executable, escapee, token, hints] + (["metrics"] if how == "ends" else [])
run = flash.submit(flash.CommandWorkload(command=argv), output_dir=out, watch=False, wait=False, max_restarts=0)
if how == "cancel":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(hints, "escapee.pid")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    print("cancelling", flush=True)
    run.cancel()
print("state", run.wait().value, flush=True)
"""


def submit_escapee(tmp_path: Path, how: str, env: dict[str, str] | None = None) -> tuple[set[int], str, str]:
    """Drive one run whose attempt leaves an escapee; → (its pids, the driver's output, the launch event)."""
    token, hints, out = secrets.token_hex(8), tmp_path / "hints", tmp_path / "out"
    hints.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", SUBMIT, str(ESCAPEE), token, str(hints), str(out), how],
                              env=process_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    seen: set[int] = set()
    try:
        wait_until(lambda: (hints / "escapee.pid").exists() or driver.poll() is not None, "the escapee", timeout=60)
        seen = escapee_pids(token)
        output, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, output
    events = json.loads((out / "run.json").read_text())["events"]
    launched = next((e["message"] for e in events if e.get("type") == "LAUNCH_STARTED"), "")
    pid_file = hints / "escapee.pid"
    recorded = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text() else None
    return seen | ({recorded} if recorded is not None else set()), output, launched


def test_flash_submit_cancel_ends_the_escapee(tmp_path: Path) -> None:
    pids, output, launched = submit_escapee(tmp_path, "cancel")
    assert pids and "state CANCELLED" in output, output
    assert "containment " in launched, launched
    seconds_until_gone(pids, "flash.submit's cancel")


def test_flash_submit_attempt_end_ends_the_escapee(tmp_path: Path) -> None:
    pids, output, _ = submit_escapee(tmp_path, "ends")
    assert pids and "state SUCCEEDED" in output, output
    seconds_until_gone(pids, "the attempt's end under flash.submit")


def test_flash_submit_under_a_subreaper_ends_the_escapee(tmp_path: Path) -> None:
    """Without cgroups: the driver adopts the escapee as a subreaper and stops it with the attempt."""
    pids, output, launched = submit_escapee(tmp_path, "ends", env={"FLASHML_CONTAINMENT": "subreaper"})
    assert "containment subreaper" in launched, launched
    assert pids and "state SUCCEEDED" in output, output
    seconds_until_gone(pids, "the attempt's end under a subreaper")


def test_with_the_process_group_alone_the_escapee_survives_the_attempt(tmp_path: Path) -> None:
    """What the container is for: the group and the marker alone never find the escapee."""
    pids, output, launched = submit_escapee(tmp_path, "ends", env={"FLASHML_CONTAINMENT": "process-group"})
    try:
        assert "containment process group only" in launched, launched
        assert pids and "state SUCCEEDED" in output, output
        time.sleep(0.5)  # not a timing assertion: the escapee must merely still be there afterwards
        assert all(pid_alive(pid) for pid in pids)
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# Two attempts of one driver at once, under a subreaper: the first one's end stops its own
# escapee and leaves the second one's processes (its leader, and that leader's detached child) alone.
TWO_AT_ONCE = f"""
import os, sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
from flashruntime.launchers.containment import containment
from flashruntime.launchers.local import LocalProcessLauncher
from flashruntime.strategies import LaunchSpec
escapee, token, hints, out = sys.argv[1:5]
assert containment().describe() == "subreaper", containment()
launcher = LocalProcessLauncher(out, term_grace_s=5)
keeper = ("import os, sys, time\\n"
          "if os.fork() == 0:\\n"
          "    os.setsid(); os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)  # kept'], {{}})\\n"
          "time.sleep(600)\\n")
second = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", keeper]), "b", "task-000")
deadline = time.monotonic() + 60
while len(second.processes()) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
kept = sorted(second.processes())
first = launcher.launch(LaunchSpec(argv=[sys.executable, escapee, token, hints, "metrics"]), "a", "task-000")
print("first", first.wait().value, flush=True)
alive = [pid for pid in kept if os.path.exists(f"/proc/{{pid}}")]
print("kept", kept, "alive", alive, flush=True)
second.cancel(grace_s=1)
print("second", second.poll().value, "left", [p for p in kept if os.path.exists(f"/proc/{{p}}")], flush=True)
"""


def test_under_a_subreaper_an_ending_attempt_leaves_another_live_attempts_processes_alone(tmp_path: Path) -> None:
    token, hints = secrets.token_hex(8), tmp_path / "hints"
    hints.mkdir()
    driver = subprocess.run([sys.executable, "-c", TWO_AT_ONCE, str(ESCAPEE), token, str(hints), str(tmp_path / "out")],
                            env=process_env(FLASHML_CONTAINMENT="subreaper"), capture_output=True, text=True,
                            timeout=120, check=False)
    assert driver.returncode == 0, driver.stdout + driver.stderr
    lines = {line.split()[0]: line for line in driver.stdout.splitlines()}
    assert lines["first"] == "first SUCCEEDED"
    kept, alive = lines["kept"].split(" alive ")
    assert kept.removeprefix("kept ") == alive and len(alive.strip("[]").split(",")) == 2, lines["kept"]
    assert lines["second"] == "second CANCELLED left []"
    escapee = int((hints / "escapee.pid").read_text())
    seconds_until_gone({escapee}, "the first attempt's end")
