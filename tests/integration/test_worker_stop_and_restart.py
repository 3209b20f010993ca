"""How the worker agent ends and starts again, against the stdlib fake coordinator with real
child processes and real signals: a stop releases the lease (no budget spent), a drain lets
the running task finish, a claim answered after a stop is given back unrun, a stop while
registering exits 0, a second worker in the same work directory is refused, and a restart
stops what an earlier worker there left running and reports its lease abandoned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flashruntime.agent import worker_cli as worker_command
from flashruntime.agent.state import STATE_DIR, AttemptEntry, AttemptJournal, WorkDirLock, lock_holder
from flashruntime.errors import WorkDirInUse, WorkerConfigError
from tests._support import pid_alive, wait_until
from tests.integration.test_service_worker import (
    STUBBORN,
    WRITE_METRICS,
    _wait_for_pids,
    argv_payload,
    coordinator,  # noqa: F401  (the fixture)
    lease_dir,
    make_agent,
    run_agent,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups")

# Waits for a file named "go" beside its output directory, then writes its metrics.
GATED = ("import json, os, time\n"
         "out = os.environ['FLASHML_OUTPUT_DIR']\n"
         "open(os.path.join(out, 'started'), 'w').close()\n"
         "while not os.path.exists(os.path.join(out, '..', 'go')):\n"
         "    time.sleep(0.02)\n"
         "json.dump({'ok': 1}, open(os.path.join(out, 'metrics.json'), 'w'))\n")


def _journal(tmp_path: Path) -> list[AttemptEntry]:
    return AttemptJournal(tmp_path / "work").entries()


def test_sigterm_stops_the_child_and_releases_the_lease_without_failing_it(coordinator, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHML_PREEMPT_GRACE_S", "0.5")  # the child ignores the notice: it is killed after this
    lease_id = coordinator.add_lease(argv_payload(STUBBORN))
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    pids: list[int] = []
    journaled: list[list[AttemptEntry]] = []

    def send_sigterm() -> None:
        pids.extend(_wait_for_pids(lease_dir(tmp_path, lease_id) / "out" / "pids"))
        journaled.append(_journal(tmp_path))
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    killer.start()
    assert run_agent(agent) == 0
    killer.join()
    assert list(coordinator.released) == [lease_id] and coordinator.released[lease_id]["abandoned"] is False
    reason = coordinator.released[lease_id]["reason"]
    assert reason.startswith(f"agent shutdown: {lease_id} preempted by SIGTERM: forwarded to pid "), reason
    assert "it was killed when the 0.5 s grace ran out" in reason and "no verified checkpoint to hand over" in reason
    assert coordinator.failed == {} and coordinator.completed == {}
    assert pids and not any(pid_alive(pid) for pid in pids)
    # while it ran, the attempt was in the journal with its first process; once reported, it is not
    (entry,) = journaled[0]
    assert (entry.lease_id, entry.node_id) == (lease_id, "node-a") and entry.pid in pids
    assert entry.output_dir == str(lease_dir(tmp_path, lease_id).resolve() / "out")
    assert _journal(tmp_path) == []


def test_with_no_preemption_signal_a_stop_stops_the_child_and_hands_nothing_over(coordinator, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHML_PREEMPT_SIGNAL", "none")
    lease_id = coordinator.add_lease(argv_payload(STUBBORN))
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    pids: list[int] = []

    def send_sigterm() -> None:
        pids.extend(_wait_for_pids(lease_dir(tmp_path, lease_id) / "out" / "pids"))
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    killer.start()
    assert run_agent(agent) == 0
    killer.join()
    assert coordinator.released == {lease_id: {"reason": "agent shutdown", "abandoned": False}}
    assert pids and not any(pid_alive(pid) for pid in pids)
    assert "preemption notice" not in (lease_dir(tmp_path, lease_id) / "launcher.log").read_text()


@pytest.mark.parametrize(("name", "value"), [("FLASHML_PREEMPT_GRACE_S", "soon"), ("FLASHML_PREEMPT_SIGNAL", "KILL")])
def test_a_preemption_setting_the_worker_cannot_use_stops_it_at_start(coordinator, tmp_path, monkeypatch, name,
                                                                      value):
    monkeypatch.setenv(name, value)
    with pytest.raises(WorkerConfigError, match=name):
        make_agent(coordinator, tmp_path, runner="trusted")


def test_sigusr1_drains_the_running_task_to_its_end_and_claims_nothing_more(coordinator, tmp_path):
    first = coordinator.add_lease(argv_payload(GATED), task_id="task-000")
    coordinator.add_lease(argv_payload(WRITE_METRICS), task_id="task-001")
    agent = make_agent(coordinator, tmp_path, runner="trusted")

    def drain_then_let_it_finish() -> None:
        started = lease_dir(tmp_path, first) / "out" / "started"
        wait_until(started.exists, "the first task to start")
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_until(lambda: agent._draining.is_set(), "the drain to be taken")
        (lease_dir(tmp_path, first) / "go").touch()

    helper = threading.Thread(target=drain_then_let_it_finish)
    helper.start()
    assert run_agent(agent) == 0
    helper.join()
    assert list(coordinator.completed) == [first]
    assert coordinator.released == {} and coordinator.failed == {}
    assert len(coordinator.queued) == 1  # the second task was never claimed
    assert len(coordinator.calls("POST", "/v1alpha1/leases/claim")) == 1
    assert agent.tasks_done == 1


def test_a_lease_answered_after_the_stop_is_given_back_unrun(coordinator, tmp_path):
    lease_id = coordinator.add_lease(argv_payload(WRITE_METRICS))
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    coordinator.on_claim = agent.stop  # the stop arrives while the claim is on its way back
    assert run_agent(agent) == 0
    assert coordinator.released == {lease_id: {"reason": "agent shutdown", "abandoned": False}}
    assert coordinator.failed == {} and coordinator.completed == {}
    assert not (lease_dir(tmp_path, lease_id) / "launcher.log").exists()


def test_a_drain_while_a_claim_is_answered_gives_the_lease_back_too(coordinator, tmp_path):
    lease_id = coordinator.add_lease(argv_payload(WRITE_METRICS))
    agent = make_agent(coordinator, tmp_path, runner="trusted")
    coordinator.on_claim = agent.drain
    assert run_agent(agent) == 0
    assert coordinator.released[lease_id]["reason"].startswith("agent draining")
    assert coordinator.completed == {}


def test_sigterm_while_registering_exits_0_without_claiming(coordinator, tmp_path):
    coordinator.register_statuses.extend([503] * 10)  # the coordinator is struggling: registration retries
    agent = make_agent(coordinator, tmp_path)

    def send_sigterm() -> None:
        wait_until(lambda: coordinator.calls("POST", "/v1alpha1/nodes/register"), "a registration attempt")
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    killer.start()
    assert run_agent(agent) == 0
    killer.join()
    assert coordinator.calls("POST", "/v1alpha1/leases/claim") == []


def test_a_second_worker_in_the_same_work_dir_is_refused_and_drain_needs_one_that_takes_signals(
        coordinator, tmp_path, caplog, capsys):
    first = make_agent(coordinator, tmp_path)
    thread = threading.Thread(target=first.run)  # off the main thread: it takes no signals
    thread.start()
    try:
        wait_until(lambda: coordinator.registrations, "the first worker to register")
        holder = lock_holder(tmp_path / "work")
        assert holder is not None and (holder.pid, holder.node_id) == (os.getpid(), "node-a")
        assert holder.drains_on_sigusr1 is False
        second = make_agent(coordinator, tmp_path, node_id="node-b")
        with caplog.at_level("ERROR", logger="flashruntime.worker"):
            assert second.run() == 2
        assert f"work directory {(tmp_path / 'work').resolve()} is in use by another worker (pid {os.getpid()}, " \
               "node node-a): two workers in one directory would stop each other's tasks" in caplog.text
        assert [r["node_id"] for r in coordinator.registrations] == ["node-a"]  # the second never registered
        assert worker_command.drain_running_worker(str(tmp_path / "work")) == 2
        assert "does not take signals" in capsys.readouterr().err
    finally:
        first.stop()
        thread.join(30)
    assert lock_holder(tmp_path / "work") is None  # released on the way out
    assert worker_command.drain_running_worker(str(tmp_path / "work")) == 1
    assert capsys.readouterr().err == f"error: no worker is running in {tmp_path / 'work'}\n"
    assert worker_command.drain_running_worker(None) == 2


def test_the_lock_names_its_holder_and_is_refused_while_held(tmp_path):
    lock = WorkDirLock(tmp_path)
    lock.acquire("box-1", drains_on_sigusr1=True)
    try:
        with pytest.raises(WorkDirInUse, match=rf"in use by another worker \(pid {os.getpid()}, node box-1\)") as exc:
            WorkDirLock(tmp_path).acquire("box-2", drains_on_sigusr1=True)
        assert exc.value.pid == os.getpid()
        assert f"flashruntime worker --drain --work-dir {tmp_path}" in str(exc.value)
        holder = lock_holder(tmp_path)
        assert holder is not None and holder.drains_on_sigusr1 and holder.node_id == "box-1"
        sent: list[tuple[int, int]] = []
        assert worker_command.drain_running_worker(str(tmp_path), send=lambda pid, sig: sent.append((pid, sig))) == 0
        assert sent == [(os.getpid(), signal.SIGUSR1)]
    finally:
        lock.release()
    assert (tmp_path / STATE_DIR / "lock").read_bytes() == b""  # a clean exit names no holder
    WorkDirLock(tmp_path).acquire("box-2", drains_on_sigusr1=False)  # free again


def test_the_journal_survives_a_damaged_file_and_keeps_only_well_formed_entries(tmp_path):
    journal = AttemptJournal(tmp_path)
    assert journal.entries() == []
    one = AttemptEntry("ls-1", "j", "t", "n", "/w/j/t/ls-1/out", 41)
    journal.add(one)
    journal.add(AttemptEntry("ls-2", "j", "t2", "n", "/w/j/t2/ls-2/out"))
    journal.add(AttemptEntry("ls-1", "j", "t", "n", "/w/j/t/ls-1/out", 42))  # the pid, once known
    assert [(e.lease_id, e.pid) for e in journal.entries()] == [("ls-2", None), ("ls-1", 42)]
    journal.forget("ls-2")
    assert [e.lease_id for e in journal.entries()] == ["ls-1"]
    journal.path.write_text(json.dumps({"attempts": [{"lease_id": "ls-3"}, "x", {**one.__dict__, "pid": True}]}))
    assert journal.entries() == [AttemptEntry("ls-1", "j", "t", "n", "/w/j/t/ls-1/out", None)]
    journal.path.write_text("{half")
    assert journal.entries() == []


# What an earlier worker left: started here as a worker starts a task (own session, the
# attempt's FLASHML_OUTPUT_DIR), plus a child that cleared its environment but stayed in the
# attempt's process group, and one in a session of its own that kept the environment.
LEFTOVER = """
import os, subprocess, sys, time
quiet = [sys.executable, "-c", "import time; time.sleep(300)"]
grouped = subprocess.Popen(quiet, env={"PATH": os.environ.get("PATH", "")})
detached = subprocess.Popen(quiet, start_new_session=True)
open(sys.argv[1], "w").write(f"{os.getpid()} {grouped.pid} {detached.pid}")
time.sleep(300)
"""


def test_a_restart_stops_what_an_earlier_worker_left_and_reports_its_lease_abandoned(coordinator, tmp_path):
    work = (tmp_path / "work")
    out = work / "job1" / "task-000" / "ls-earlier" / "out"
    out.mkdir(parents=True)
    pids_file = tmp_path / "leftover-pids"
    leftover = subprocess.Popen([sys.executable, "-c", LEFTOVER, str(pids_file)], start_new_session=True,
                                env={**os.environ, "FLASHML_OUTPUT_DIR": str(out.resolve())})
    # An unrelated process whose group id the journal records too (a recycled id): it carries no
    # marker, so it must be left alone.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3, "the leftover to start")
        pids = [int(pid) for pid in pids_file.read_text().split()]
        journal = AttemptJournal(work.resolve())
        journal.add(AttemptEntry("ls-earlier", "job1", "task-000", "node-a", str(out.resolve()), leftover.pid))
        journal.add(AttemptEntry("ls-other", "job1", "task-001", "node-a", str(work.resolve() / "gone"),
                                 bystander.pid))
        with coordinator.lock:
            coordinator.leases["ls-earlier"] = {"lease_id": "ls-earlier"}
        new_lease = coordinator.add_lease(argv_payload(WRITE_METRICS), task_id="task-002")
        agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)
        assert run_agent(agent) == 0
        assert not any(pid_alive(pid) for pid in pids)
        assert pid_alive(bystander.pid)
        assert coordinator.released["ls-earlier"]["abandoned"] is True
        assert "stopped without reporting" in coordinator.released["ls-earlier"]["reason"]
        assert list(coordinator.completed) == [new_lease]
        order = [r.path for r in coordinator.requests if r.path.endswith(("/release", "/claim"))]
        assert order[:2] == ["/v1alpha1/attempts/ls-earlier/release", "/v1alpha1/attempts/ls-other/release"]
        assert order[2] == "/v1alpha1/leases/claim"  # nothing was claimed before the report
        assert _journal(tmp_path) == []  # reported (or unknown to the coordinator): forgotten
    finally:
        for process in (leftover, bystander):
            if process.poll() is None:
                process.kill()
            process.wait()
