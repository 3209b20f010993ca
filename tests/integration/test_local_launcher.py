"""LocalProcessLauncher with real processes: environment contract, process groups,
and no survivor after cancel or after the leader dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from flashruntime.errors import FlashRuntimeError
from flashruntime.launchers import LaunchError, LaunchState, _sweep
from flashruntime.launchers.local import LocalLaunchHandle, LocalProcessLauncher, aside_path
from flashruntime.monitor import ResourceSampler
from flashruntime.strategies import LaunchSpec
from tests._support import pid_alive, wait_until

# A child in its own session (as torchrun starts ranks) that ignores SIGTERM and records its pid.
STUBBORN_CHILD = """
import os, signal, subprocess, sys, time
code = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "child.pid"), "w").write(str(child.pid))
print("ready", flush=True)
{tail}
"""


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def test_environment_contract_and_log(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path / "out")
    code = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "['FLASHML_OUTPUT_DIR', 'FLASHML_CKPT_DIR', 'FLASHML_JOB_ID', 'FLASHML_ATTEMPT_ID', 'MINE']}))")
    spec = LaunchSpec(argv=[sys.executable, "-c", code], workdir_hint=str(tmp_path),
                      env={"MINE": "1", "FLASHML_JOB_ID": "spoofed"}, files={"cfg/a.txt": "hello"})
    handle = launcher.launch(spec, "local", "task-000")
    assert handle.wait() is LaunchState.SUCCEEDED and handle.exit_code == 0
    env = json.loads(handle.logs().strip().splitlines()[-1])
    attempt_dir = (tmp_path / "out" / "local" / "task-000").resolve()
    assert env == {"FLASHML_OUTPUT_DIR": str(attempt_dir), "FLASHML_CKPT_DIR": str(attempt_dir.parent / "ckpt"),
                   "FLASHML_JOB_ID": "local", "FLASHML_ATTEMPT_ID": "task-000", "MINE": "1"}
    assert (attempt_dir / "cfg" / "a.txt").read_text() == "hello"
    assert (attempt_dir / "launcher.log").exists() and handle.output_dir == attempt_dir
    assert handle.execution_id.isdigit()


def test_checkpoint_dir_override(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path / "out", checkpoint_dir=tmp_path / "shared-ckpt")
    handle = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "import os; print(os.environ['FLASHML_CKPT_DIR'])"]),
                             "local", "task-000")
    handle.wait()
    assert handle.logs().strip() == str((tmp_path / "shared-ckpt").resolve())


def test_states_and_exit_codes(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path)
    failed = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "raise SystemExit(3)"]), "j", "a1")
    assert failed.wait() is LaunchState.FAILED and failed.exit_code == 3
    assert failed.poll() is LaunchState.FAILED  # cached, idempotent
    killed = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"]),
                             "j", "a2")
    assert killed.wait() is LaunchState.FAILED and killed.exit_code == -signal.SIGKILL
    running = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(30)"]), "j", "a3")
    assert running.poll() is LaunchState.RUNNING and running.exit_code is None
    assert running.wait(timeout_seconds=0.1) is LaunchState.RUNNING
    running.cancel()
    assert running.poll() is LaunchState.CANCELLED
    running.cancel()  # idempotent


def test_child_runs_in_its_own_process_group(tmp_path: Path) -> None:
    handle = LocalProcessLauncher(tmp_path).launch(
        LaunchSpec(argv=[sys.executable, "-c", "import os; print(os.getpgrp() == os.getpid(), os.getsid(0) == os.getpid())"]),
        "j", "a")
    handle.wait()
    assert handle.logs().strip() == "True True"


@pytest.mark.parametrize("spec, message", [
    (LaunchSpec(argv=[]), "cannot launch an empty command"),
    (LaunchSpec(argv=["python"], workdir_hint="/no/such/dir"), "does not exist"),
    (LaunchSpec(argv=["/no/such/binary-xyz"]), "could not start"),
    (LaunchSpec(argv=["python"], files={"../escape.txt": "x"}), "must be a relative path"),
])
def test_launch_errors(tmp_path: Path, spec: LaunchSpec, message: str) -> None:
    with pytest.raises(LaunchError, match=message) as info:
        LocalProcessLauncher(tmp_path).launch(spec, "j", "a")
    assert isinstance(info.value, FlashRuntimeError)
    assert not (tmp_path.parent / "escape.txt").exists()


def test_cancel_kills_a_child_in_another_session_that_ignores_sigterm(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=0.5)
    handle = launcher.launch(
        LaunchSpec(argv=[sys.executable, "-c", STUBBORN_CHILD.format(tail="time.sleep(300)")]), "j", "a")
    child = int(_wait_for(handle.output_dir / "child.pid"))
    assert pid_alive(child) and os.getpgid(child) != int(handle.execution_id)  # out of reach of a group kill
    handle.cancel()
    assert handle.poll() is LaunchState.CANCELLED
    assert not pid_alive(child) and not pid_alive(int(handle.execution_id))


def test_cancel_with_no_grace_kills_at_once_what_ignores_sigterm(tmp_path: Path) -> None:
    """``cancel(grace_s=0)``, the hurry of a second Ctrl-C: the launcher's long grace period is
    not waited out, so the child that ignores SIGTERM dies of SIGKILL."""
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=300)  # a wait this long would hang the test
    handle = launcher.launch(
        LaunchSpec(argv=[sys.executable, "-c", STUBBORN_CHILD.format(tail="time.sleep(300)")]), "j", "a")
    child = int(_wait_for(handle.output_dir / "child.pid"))
    cancel = threading.Thread(target=handle.cancel, kwargs={"grace_s": 0}, daemon=True)
    cancel.start()
    cancel.join(timeout=60)  # hang guard: the launcher's own grace would take 300 s
    try:
        assert not cancel.is_alive(), "cancel(grace_s=0) waited out the launcher's grace period"
        assert handle.poll() is LaunchState.CANCELLED
        assert not pid_alive(child) and not pid_alive(int(handle.execution_id))
    finally:
        _kill_quietly(child, int(handle.execution_id))


def test_cancel_with_no_grace_does_not_wait_when_the_leader_has_exited_already(tmp_path: Path) -> None:
    """The leader is gone (a wrapper script, torchrun ending before its workers) but its child,
    in a session of its own, ignores SIGTERM: settling must not wait out the launcher's grace."""
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=300)
    handle = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", STUBBORN_CHILD.format(tail="")]), "j", "a")
    child = int(_wait_for(handle.output_dir / "child.pid"))
    wait_until(lambda: handle._process.poll() is not None, "the leader to exit")
    cancel = threading.Thread(target=handle.cancel, kwargs={"grace_s": 0}, daemon=True)
    cancel.start()
    cancel.join(timeout=60)  # hang guard: the launcher's own grace would take 300 s
    try:
        assert not cancel.is_alive(), "cancel(grace_s=0) waited out the launcher's grace period"
        assert handle.poll() is LaunchState.SUCCEEDED  # the leader's exit decides, not the late cancel
        assert not pid_alive(child)
    finally:
        _kill_quietly(child)


def test_cancel_without_grace_s_keeps_the_launchers_unvalidated_grace(tmp_path: Path) -> None:
    """``term_grace_s`` was never validated; a negative one still cancels (as 0 would)."""
    handle = LocalProcessLauncher(tmp_path, term_grace_s=-1).launch(
        LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(300)"]), "j", "a")
    handle.cancel()
    assert handle.poll() is LaunchState.CANCELLED


@pytest.mark.parametrize("grace_s", [-1, float("nan"), float("inf"), True, "5", 10**400])
def test_cancel_refuses_a_grace_period_that_is_not_a_duration(tmp_path: Path, grace_s: object) -> None:
    handle = LocalProcessLauncher(tmp_path, term_grace_s=0.5).launch(
        LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(300)"]), "j", "a")
    try:
        with pytest.raises(ValueError, match=r"grace_s must be a finite number of seconds >= 0 or None, got"):
            handle.cancel(grace_s=grace_s)  # type: ignore[arg-type]
        assert handle.poll() is LaunchState.RUNNING  # refused before anything was signalled
    finally:
        handle.cancel()
    assert handle.poll() is LaunchState.CANCELLED


def test_a_non_utf8_attempt_directory_launches_and_cancel_reaches_every_process(tmp_path: Path) -> None:
    """A path that is not UTF-8 (surrogate-escaped in Python) is a valid directory: the
    launch succeeds and the attempt's marker is the path's own bytes, so the sweep still
    finds a child in another session by its environment."""
    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/out-\xff"))
    launcher = LocalProcessLauncher(root, term_grace_s=0.5)
    spec = LaunchSpec(argv=[sys.executable, "-c", STUBBORN_CHILD.format(tail="time.sleep(300)")])
    handle = launcher.launch(spec, "j", "a")
    child = int(_wait_for(handle.output_dir / "child.pid"))
    try:
        assert pid_alive(child) and os.getpgid(child) != int(handle.execution_id)
        handle.cancel()
        assert handle.poll() is LaunchState.CANCELLED
        assert not pid_alive(child) and not pid_alive(int(handle.execution_id))
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)


def test_leader_death_sweeps_the_survivors_before_reporting(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=0.5)
    tail = "import time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)"
    handle = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", STUBBORN_CHILD.format(tail=tail)]), "j", "a")
    child = int(_wait_for(handle.output_dir / "child.pid"))
    assert handle.wait() is LaunchState.FAILED and handle.exit_code == -signal.SIGKILL
    assert not pid_alive(child)


def test_sweep_leaves_other_attempts_alone(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=0.5)
    other = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(60)"]), "j", "other")
    done = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "pass"]), "j", "done")
    assert done.wait() is LaunchState.SUCCEEDED
    assert other.poll() is LaunchState.RUNNING
    other.cancel()


def test_cancel_is_prompt_when_extra_pids_include_the_unreaped_leader(tmp_path: Path) -> None:
    """``extra_pids`` (the sampler's view) may name the leader, which is a zombie until it
    is reaped after the sweep: ``kill(pid, 0)`` succeeds on it, so the sweep must not wait for it."""
    launcher = LocalProcessLauncher(tmp_path, term_grace_s=2.0)
    handle = launcher.launch(LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(300)"]), "j", "a")
    leader = int(handle.execution_id)
    handle.extra_pids = lambda: {leader}
    time.sleep(0.2)
    start = time.monotonic()
    handle.cancel()
    assert handle.poll() is LaunchState.CANCELLED
    assert time.monotonic() - start < 8.0  # hang guard: a zombie counted as alive costs grace + 30 s


@pytest.mark.parametrize("code, state, exit_code", [
    ("pass", LaunchState.SUCCEEDED, 0),
    ("raise SystemExit(3)", LaunchState.FAILED, 3),
])
def test_cancel_after_the_process_exited_leaves_the_exit_state(tmp_path: Path, code: str, state: LaunchState,
                                                                exit_code: int) -> None:
    handle = LocalProcessLauncher(tmp_path).launch(LaunchSpec(argv=[sys.executable, "-c", code]), "j", "a")
    # Block until the process has exited, leaving it unreaped: the handle has not seen the exit yet.
    os.waitid(os.P_PID, int(handle.execution_id), os.WEXITED | os.WNOWAIT)
    handle.cancel()
    assert handle.poll() is state and handle.exit_code == exit_code


def test_an_earlier_runs_attempt_directory_is_moved_aside_never_reused(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path)
    spec = LaunchSpec(argv=[sys.executable, "-c", "import os; print('run', os.environ['RUN'])"])
    handles = []
    for n in range(3):
        handle = launcher.launch(spec.model_copy(update={"env": {"RUN": str(n)}}), "local", "task-000")
        assert handle.wait() is LaunchState.SUCCEEDED
        assert handle.logs().strip() == f"run {n}"  # the log holds this run only
        handles.append(handle)
    job = tmp_path.resolve() / "local"
    assert handles[0].previous_dir is None
    moved = [h.previous_dir for h in handles[1:]]
    assert all(p is not None and p.parent == job for p in moved) and moved[0] != moved[1]
    assert sorted((p / "launcher.log").read_text() for p in moved) == ["run 0\n", "run 1\n"]  # type: ignore[operator]
    assert sorted(p.name for p in job.iterdir()) == sorted(["task-000", *(p.name for p in moved)])  # type: ignore[union-attr]
    # An empty directory holds nothing of an earlier run: it is used as it is.
    (job / "task-001").mkdir()
    assert launcher.launch(spec.model_copy(update={"env": {"RUN": "x"}}), "local", "task-001").previous_dir is None


def test_aside_names_are_utc_stamped_and_unique(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "task-000-r1"
    now = datetime(2026, 11, 30, 3, 35, 7, tzinfo=timezone.utc)
    assert aside_path(attempt_dir, now) == tmp_path / "task-000-r1.prev-20261130T033507"
    (tmp_path / "task-000-r1.prev-20261130T033507").mkdir()
    (tmp_path / "task-000-r1.prev-20261130T033507-1").write_text("")
    assert aside_path(attempt_dir, now) == tmp_path / "task-000-r1.prev-20261130T033507-2"


# Outside Linux: no /proc, so the sweep's only view of processes that left the
# leader's group is the resource sampler's last-seen set; on Windows there is also no
# os.killpg / getpgrp / getpgid / getuid and no SIGKILL. These tests take those away from
# the real code and drive it with real processes.
KILL = signal.SIGKILL  # captured before any test removes it

# A leader that starts a child in its own session (as torchrun starts ranks), records the
# child's pid and exits once the test creates ``go``, leaving the child orphaned.
ORPHANING_LEADER = """
import os, subprocess, sys, time
out = os.environ["FLASHML_OUTPUT_DIR"]
child = subprocess.Popen([sys.executable, "-c", {child!r}], start_new_session=True)
open(os.path.join(out, "child.pid"), "w").write(str(child.pid))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
"""
SLEEPER = "import time; time.sleep(300)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"


def _tick_count(sampler: ResourceSampler) -> int:
    return len(sampler.path.read_text().splitlines()) if sampler.path.exists() else 0


def _without_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str) -> None:
    monkeypatch.setattr(_sweep, "_PROC", tmp_path / "no-proc")
    monkeypatch.setattr(sys, "platform", platform)
    if platform == "win32":
        for name in ("killpg", "getpgrp", "getpgid", "getuid"):
            monkeypatch.delattr(os, name)
        monkeypatch.delattr(signal, "SIGKILL")


def _kill_quietly(*pids: int) -> None:
    for pid in pids:
        if pid > 0:
            with contextlib.suppress(OSError):
                os.kill(pid, KILL)


def _watched_orphaning_leader(tmp_path: Path, child_code: str) -> tuple[LocalLaunchHandle, ResourceSampler, int]:
    """Launch ORPHANING_LEADER and wire a real sampler as the SDK does; returns once the
    sampler has seen the child."""
    pytest.importorskip("psutil")
    handle = LocalProcessLauncher(tmp_path / "out", term_grace_s=0.5).launch(
        LaunchSpec(argv=[sys.executable, "-c", ORPHANING_LEADER.format(child=child_code)]), "j", "a")
    sampler = ResourceSampler(tmp_path / "telemetry", int(handle.execution_id), period_s=0.1)
    handle.extra_pids = sampler.last_seen_pids
    sampler.start()
    child = int(_wait_for(handle.output_dir / "child.pid"))
    wait_until(lambda: child in sampler.last_seen_pids(), "the sampler to see the child")
    return handle, sampler, child


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_without_proc_an_orphan_the_sampler_saw_is_stopped_after_the_leader_exits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    # macOS: a child that ignores SIGTERM must still end by SIGKILL. Windows has no SIGKILL;
    # there os.kill(pid, SIGTERM) is TerminateProcess, so a plain sleeper stands in.
    handle, sampler, child = _watched_orphaning_leader(tmp_path, STUBBORN if platform == "darwin" else SLEEPER)
    leader = int(handle.execution_id)
    try:
        _without_proc(monkeypatch, tmp_path, platform)
        (handle.output_dir / "go").write_text("")
        # Let the sampler tick while the leader is an unreaped zombie and after it is gone:
        # neither tick can see the orphan, and neither may erase it from the last-seen set.
        os.waitid(os.P_PID, leader, os.WEXITED | os.WNOWAIT)
        ticks = _tick_count(sampler)
        wait_until(lambda: _tick_count(sampler) >= ticks + 2, "two ticks after the leader exited")
        assert handle.wait() is LaunchState.SUCCEEDED
        assert not pid_alive(child)
    finally:
        monkeypatch.undo()
        sampler.stop()
        handle.cancel()
        _kill_quietly(child)


def test_without_posix_process_calls_cancel_stops_the_leader_and_its_orphans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handle, sampler, child = _watched_orphaning_leader(tmp_path, SLEEPER)
    leader = int(handle.execution_id)
    try:
        _without_proc(monkeypatch, tmp_path, "win32")
        handle.cancel()
        assert handle.poll() is LaunchState.CANCELLED
        assert not pid_alive(leader) and not pid_alive(child)
    finally:
        monkeypatch.undo()
        sampler.stop()
        handle.cancel()
        _kill_quietly(leader, child)


def test_without_proc_or_psutil_cancel_still_stops_the_leader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psutil the sampler sees the root alone and nothing may probe pids on Windows
    (signal 0 is CTRL_C_EVENT there): the leader is found through its Popen."""
    handle = LocalProcessLauncher(tmp_path, term_grace_s=0.5).launch(LaunchSpec(argv=[sys.executable, "-c", SLEEPER]),
                                                                     "j", "a")
    leader = int(handle.execution_id)
    try:
        _without_proc(monkeypatch, tmp_path, "win32")
        monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
        handle.extra_pids = lambda: {leader}  # what a sampler without psutil reports
        handle.cancel()
        assert handle.poll() is LaunchState.CANCELLED and not pid_alive(leader)
    finally:
        monkeypatch.undo()
        handle.cancel()
        _kill_quietly(leader)


def test_a_sampler_pid_without_the_attempts_marker_is_never_signalled(tmp_path: Path) -> None:
    """With /proc the sampler's pids can be seconds old, so a pid it names may have been
    recycled: one that does not carry the attempt's marker (here an unrelated process of the
    same user) survives the sweep."""
    if not _sweep.proc_available():
        pytest.skip("needs /proc")
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLASHML_")}
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)
    try:
        handle = LocalProcessLauncher(tmp_path, term_grace_s=0.5).launch(
            LaunchSpec(argv=[sys.executable, "-c", "pass"]), "j", "a")
        handle.extra_pids = lambda: {stranger.pid}
        assert handle.wait() is LaunchState.SUCCEEDED
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
