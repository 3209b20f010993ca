"""The process container of one attempt: which kind is chosen (cgroup v2, subreaper,
process group), a real cgroup made, a child placed in it before it runs, its members
stopped (``cgroup.kill``, or each pid where that file is missing) and the cgroup removed;
the fallback when no cgroup can be made; a recorded cgroup ended only where the agent
makes them. Real cgroups, where this machine lets the tests make them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashruntime.agent.state import AttemptEntry, AttemptJournal
from flashruntime.errors import LaunchError
from flashruntime.launchers.containment import (
    CGROUP_PARENT,
    AttemptCgroup,
    Containment,
    ContainmentKind,
    containment,
    detect_containment,
    end_leftover_cgroup,
    own_cgroup,
    parse_cgroup2_mount,
)
from flashruntime.launchers.local import spawn_contained
from tests._support import pid_alive, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process containers")

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_ONLY = """\
22 1 0:20 / /proc rw - proc proc rw
28 23 0:25 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
"""
BIND_MOUNTED = "28 23 0:25 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
NO_V2 = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
# Ignores SIGTERM: only SIGKILL ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"

needs_cgroups = pytest.mark.skipif(containment().kind is not ContainmentKind.CGROUP,
                                   reason=f"attempts are not contained by cgroups here: {containment().reason}")


def never_subreaper() -> bool:
    return False


def always_subreaper() -> bool:
    return True


def test_the_v2_hierarchy_is_found_on_hybrid_and_v2_only_layouts() -> None:
    assert parse_cgroup2_mount(HYBRID) == (Path("/sys/fs/cgroup/unified"), "/")
    assert parse_cgroup2_mount(V2_ONLY) == (Path("/sys/fs/cgroup"), "/")
    assert parse_cgroup2_mount(BIND_MOUNTED) == (Path("/sys/fs/cgroup"), "/docker/abc")
    assert parse_cgroup2_mount(NO_V2) is None
    assert own_cgroup("4:memory:/x\n0::/system.slice/worker.service\n") == "/system.slice/worker.service"
    assert own_cgroup("4:memory:/x\n") is None


def test_own_cgroup_below_a_bind_mounted_root_is_found_under_its_mount(tmp_path: Path) -> None:
    mountinfo, proc_cgroup = tmp_path / "mountinfo", tmp_path / "cgroup"
    mountinfo.write_text(BIND_MOUNTED)
    proc_cgroup.write_text("0::/elsewhere/xyz\n")
    chosen = detect_containment(mountinfo=mountinfo, proc_cgroup=proc_cgroup, requested="auto",
                                become_subreaper=always_subreaper)
    assert chosen.kind is ContainmentKind.SUBREAPER
    assert chosen.reason == "cgroup /elsewhere/xyz is outside the mount at /sys/fs/cgroup"
    mountinfo.write_text(NO_V2)
    chosen = detect_containment(mountinfo=mountinfo, proc_cgroup=proc_cgroup, requested="auto",
                                become_subreaper=never_subreaper)
    assert chosen.describe() == "process group only"
    assert chosen.reason.startswith("no cgroup v2 hierarchy is mounted; prctl(PR_SET_CHILD_SUBREAPER) failed")


def test_a_root_that_is_no_cgroup_or_is_missing_falls_back_to_the_subreaper(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for root in (plain, tmp_path / "missing"):
        chosen = detect_containment(cgroup_root=root, requested="auto", become_subreaper=always_subreaper)
        assert (chosen.kind, chosen.describe()) == (ContainmentKind.SUBREAPER, "subreaper")
        assert chosen.reason == f"{root} is not a cgroup v2 directory"
    assert not (plain / CGROUP_PARENT).exists()  # nothing made where no cgroup can be


def test_a_root_that_is_not_writable_falls_back(tmp_path: Path) -> None:
    # Looks like a cgroup directory, but nothing can be made in it (read-only, even for root,
    # as a file in place of the parent directory makes it).
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.procs").write_text("")
    (root / CGROUP_PARENT).write_text("not a directory")
    chosen = detect_containment(cgroup_root=root, requested="auto", become_subreaper=always_subreaper)
    assert chosen.kind is ContainmentKind.SUBREAPER
    assert chosen.reason.startswith(f"cannot create a cgroup under {root}")


def test_a_directory_that_takes_no_processes_falls_back(tmp_path: Path) -> None:
    # mkdir works, but the child cannot enter: its cgroup.procs is no file the kernel serves.
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.procs").write_text("")
    chosen = detect_containment(cgroup_root=root, requested="auto", become_subreaper=always_subreaper)
    assert chosen.kind is ContainmentKind.SUBREAPER
    assert chosen.reason.startswith(f"cannot place a process in a cgroup under {root / CGROUP_PARENT}")
    assert [p.name for p in (root / CGROUP_PARENT).iterdir()] == []  # the probe's cgroup is removed


def test_the_requested_containment_is_honoured_and_a_bad_one_refused(tmp_path: Path) -> None:
    assert detect_containment(requested="process-group").kind is ContainmentKind.PROCESS_GROUP
    assert detect_containment(requested="subreaper", become_subreaper=always_subreaper).kind is \
        ContainmentKind.SUBREAPER
    assert detect_containment(requested="auto", platform="darwin").describe() == "process group only"
    with pytest.raises(LaunchError, match=r"FLASHML_CONTAINMENT='jail' is not a containment; use one of auto, "
                                          r"cgroup, subreaper, process-group"):
        detect_containment(requested="jail")
    with pytest.raises(LaunchError, match=r"FLASHML_CONTAINMENT=cgroup but no cgroup can be made here: .* is not a "
                                          r"cgroup v2 directory; run as root or in a delegated cgroup v2 subtree"):
        detect_containment(cgroup_root=tmp_path, requested="cgroup", become_subreaper=always_subreaper)


@pytest.fixture
def cgroup() -> Iterator[AttemptCgroup]:
    chosen = containment()
    if chosen.kind is not ContainmentKind.CGROUP or chosen.parent is None:
        pytest.skip(f"attempts are not contained by cgroups here: {chosen.reason}")
    made = AttemptCgroup.create(chosen.parent, "test attempt/1")
    try:
        yield made
    finally:
        made.close()


def start_in(cgroup: AttemptCgroup, code: str) -> subprocess.Popen[bytes]:
    return spawn_contained([sys.executable, "-c", code], cgroup, cwd=Path.cwd(), env=dict(os.environ),
                           stdout=subprocess.PIPE)


def test_a_child_placed_in_its_cgroup_and_its_escapee_are_killed_and_the_cgroup_removed(cgroup) -> None:
    assert cgroup.path.name.startswith("test_attempt_1-")  # made safe, and unique per process
    # The leader forks a child that leaves for a session of its own with an empty environment.
    leader = start_in(cgroup, "import os, sys, time\n"
                              "if os.fork() == 0:\n"
                              "    os.setsid(); os.execve(sys.executable, [sys.executable, '-c', "
                              "'import time; time.sleep(600)'], {})\n"
                              "print('up', flush=True); time.sleep(600)\n")
    assert leader.stdout is not None and leader.stdout.readline() == b"up\n"
    wait_until(lambda: len(cgroup.members()) == 2, "the leader and its escapee in the cgroup")
    members = cgroup.members()
    assert leader.pid in members and cgroup.populated()
    hierarchy = parse_cgroup2_mount(Path("/proc/self/mountinfo").read_text())
    assert hierarchy is not None
    assert f"0::/{cgroup.path.relative_to(hierarchy[0])}" in Path(f"/proc/{leader.pid}/cgroup").read_text().split()
    cgroup.close()
    assert leader.wait(timeout=30) == -signal.SIGKILL
    assert not any(pid_alive(pid) for pid in members)
    assert not cgroup.path.exists()
    cgroup.close()  # again: nothing to do


def test_stop_gives_sigterm_its_grace_then_kills(cgroup) -> None:
    polite = start_in(cgroup, "import time; print('up', flush=True); time.sleep(600)")
    assert polite.stdout is not None and polite.stdout.readline() == b"up\n"
    cgroup.stop(grace_s=30)
    assert polite.wait(timeout=30) == -signal.SIGTERM  # it ended on SIGTERM, within its grace
    assert not cgroup.path.exists()


def test_without_cgroup_kill_each_member_is_killed_until_the_cgroup_is_empty(cgroup) -> None:
    stubborn = [start_in(cgroup, STUBBORN) for _ in range(3)]
    for process in stubborn:
        assert process.stdout is not None and process.stdout.readline() == b"up\n"
    cgroup.signal(signal.SIGTERM)  # ignored
    assert all(process.poll() is None for process in stubborn)
    assert cgroup.kill(use_cgroup_kill=False)
    assert [process.wait(timeout=30) for process in stubborn] == [-signal.SIGKILL] * 3
    assert not cgroup.populated()


def test_a_child_that_cannot_enter_its_container_never_runs(cgroup, tmp_path: Path) -> None:
    cgroup.path.rmdir()  # gone before the spawn: the child's write to cgroup.procs fails
    marker = tmp_path / "ran"
    with open(tmp_path / "log", "wb") as log, pytest.raises(subprocess.SubprocessError):
        spawn_contained([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], cgroup, cwd=tmp_path,
                        env=dict(os.environ), stdout=log)
    assert not marker.exists()


@needs_cgroups
def test_a_recorded_cgroup_is_ended_only_where_the_agent_makes_them(tmp_path: Path) -> None:
    parent = containment().parent
    assert parent is not None
    hierarchy = parse_cgroup2_mount(Path("/proc/self/mountinfo").read_text())
    assert hierarchy is not None
    # Outside a flashruntime directory: a damaged journal must not make the agent kill it.
    stray = parent.parent / f"not-an-attempt-{os.getpid()}"
    stray.mkdir()
    bystander: subprocess.Popen[bytes] | None = None
    try:
        bystander = start_in(AttemptCgroup(stray), "import time; print('up', flush=True); time.sleep(600)")
        assert bystander.stdout is not None and bystander.stdout.readline() == b"up\n"
        # Another agent's attempts beside this one's (its own cgroup's flashruntime/ directory).
        other_agent = parent.parent / f"other-agent-{os.getpid()}" / CGROUP_PARENT
        other_agent.mkdir(parents=True)
        theirs = AttemptCgroup.create(other_agent, "theirs")
        for path in (stray, parent, hierarchy[0], parent / "..", tmp_path / CGROUP_PARENT / "x-1-1", theirs.path):
            assert end_leftover_cgroup(path, 0.0) == set()
        assert theirs.path.exists()
        theirs.path.rmdir()
        other_agent.rmdir()
        other_agent.parent.rmdir()
        assert bystander.poll() is None and stray.exists()
    finally:
        if bystander is not None:
            bystander.kill()
            bystander.wait()
        wait_until(lambda: not AttemptCgroup(stray).populated(), "the bystander to leave")
        with contextlib.suppress(OSError):
            stray.rmdir()
    # Inside one but made by another live agent (a second worker of the same service): left
    # alone. Its creator here is the process it holds, started as a worker is.
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "-m", "flashruntime.cli",
                               "worker"])
    live_agents = AttemptCgroup(parent / f"live-agent-{keeper.pid}-1")
    live_agents.path.mkdir()
    try:
        (live_agents.path / "cgroup.procs").write_text(str(keeper.pid))
        assert end_leftover_cgroup(live_agents.path, 0.0) == set()
        assert keeper.poll() is None and live_agents.path.exists()
    finally:
        keeper.kill()
        keeper.wait()
        wait_until(lambda: not live_agents.populated(), "the live agent's attempt to end")
        live_agents.path.rmdir()
    # Inside one, made by this process or one that is gone: its processes are stopped and it is removed.
    leftover = AttemptCgroup.create(parent, "leftover")
    sleeper = start_in(leftover, "import time; print('up', flush=True); time.sleep(600)")
    assert sleeper.stdout is not None and sleeper.stdout.readline() == b"up\n"
    assert end_leftover_cgroup(leftover.path, 5.0) == {sleeper.pid}
    assert sleeper.wait(timeout=30) == -signal.SIGTERM
    assert not leftover.path.exists()


def test_empty_cgroups_of_processes_that_are_gone_are_removed_by_the_next_probe() -> None:
    chosen = containment()
    if chosen.kind is not ContainmentKind.CGROUP or chosen.parent is None:
        pytest.skip(f"attempts are not contained by cgroups here: {chosen.reason}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    abandoned = chosen.parent / f"task-000-{gone.stdout.strip()}-7"
    abandoned.mkdir()
    mine = AttemptCgroup.create(chosen.parent, "kept")  # its maker (this process) is alive
    try:
        again = detect_containment(requested="cgroup")
        assert again == Containment(ContainmentKind.CGROUP, chosen.parent)
        assert not abandoned.exists() and mine.path.exists()
    finally:
        mine.close()
        with contextlib.suppress(OSError):
            abandoned.rmdir()


def test_the_journal_keeps_the_cgroup_and_an_old_journal_without_it_still_loads(tmp_path: Path) -> None:
    journal = AttemptJournal(tmp_path)
    journal.add(AttemptEntry("ls-1", "j", "t", "n", "/w/j/t/ls-1/out", 41, "/sys/fs/cgroup/flashruntime/ls-1-7-0"))
    assert journal.entries()[0].cgroup == "/sys/fs/cgroup/flashruntime/ls-1-7-0"
    # Written before attempts had cgroups, and one whose cgroup is no absolute path.
    journal.path.write_text(json.dumps({"attempts": [
        {"lease_id": "ls-2", "job_id": "j", "task_id": "t", "node_id": "n", "output_dir": "/w/out", "pid": 7},
        {"lease_id": "ls-3", "job_id": "j", "task_id": "t", "node_id": "n", "output_dir": "/w/out3", "cgroup": "x/y"},
    ]}))
    assert journal.entries() == [AttemptEntry("ls-2", "j", "t", "n", "/w/out", 7, None),
                                 AttemptEntry("ls-3", "j", "t", "n", "/w/out3", None, None)]
