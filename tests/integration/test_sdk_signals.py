"""No attempt outlives the process driving it: a SIGTERM or SIGHUP to
a process inside ``flash.submit`` or the ``flashruntime submit`` CLI, or the end of a
script that left a ``wait=False`` run going, cancels and settles the run first; the
process then ends as the signal (or the script) would have ended it. Real processes.
Here no signal is a preemption notice (``FLASHML_PREEMPT_SIGNAL=none``), so a SIGTERM
cancels as a Ctrl-C does; test_preemption covers the notice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._support import REPO_ROOT, pid_alive, wait_until

PY = sys.executable

# The attempt: records its pid in its attempt directory, then sleeps far past any test.
SLEEPER = ("import os, time; open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'pid'), 'w')"
           ".write(str(os.getpid())); time.sleep(300)")

PRELUDE = f"""
import os, signal, sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
import flashruntime as flash
out = sys.argv[1]
sleeper = flash.CommandWorkload(command=[sys.executable, "-c", {SLEEPER!r}])

def until_the_attempt_runs():
    pid_file = os.path.join(out, "local", "task-000", "pid")
    deadline = time.monotonic() + 60
    while not (os.path.exists(pid_file) and open(pid_file).read()) and time.monotonic() < deadline:
        time.sleep(0.02)
"""

# submit(wait=True), as a training script calls it.
INLINE = PRELUDE + """
flash.submit(sleeper, output_dir=out, max_restarts=2, watch=False)
print("submit returned", flush=True)
"""

# wait=False, then the script ends with the run still going.
ENDS_EARLY = PRELUDE + """
run = flash.submit(sleeper, output_dir=out, max_restarts=2, watch=False, wait=False)
until_the_attempt_runs()
print("script ends", flush=True)
"""

# A run that has ended leaves SIGTERM doing what it did before any run.
AFTER_THE_RUN = PRELUDE + """
run = flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=out, watch=False,
                   wait=False)
run.wait()
print("ready", flush=True)
time.sleep(300)
"""

# A handler of the user's own is left in place: it decides how the process ends.
OWN_HANDLER = PRELUDE + """
def stop(signum, frame):
    raise SystemExit(3)
signal.signal(signal.SIGTERM, stop)
flash.submit(sleeper, output_dir=out, watch=False)
"""

# A forked child (multiprocessing's default on Linux) drives none of its parent's runs: a
# SIGTERM to it ends it alone, as before, and never cancels the parent's run; its handler
# is the default again (a sleeping child would otherwise only wake to run a Python one).
FORKED = PRELUDE + """
run = flash.submit(sleeper, output_dir=out, watch=False, wait=False)
until_the_attempt_runs()
statuses = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        time.sleep(10)
        os._exit(0)  # a child that missed the signal: the assertion fails, after 10 s
    os.kill(pid, signal.SIGTERM)  # at once: a signal reaching the child inside fork() is not lost either
    statuses.append(os.waitpid(pid, 0)[1])
died = all(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM for status in statuses)
answer, tell = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(tell, b"default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else b"handler")
    os._exit(0)
os.waitpid(pid, 0)
print(died, os.read(answer, 16).decode(), run.state, flush=True)
run.cancel()
run.wait()
"""

# Handlers around an inline submit: installed over the default only, and put back after.
HANDLERS = PRELUDE + """
def mine(signum, frame):
    pass
signal.signal(signal.SIGHUP, mine)
quick = flash.CommandWorkload(command=[sys.executable, "-c", "pass"])
flash.submit(quick, output_dir=out, watch=False)
print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGHUP) is mine, flush=True)
"""


def _start(code: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-c", code, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _attempt_pid(out: Path) -> int:
    pid_file = out / "local" / "task-000" / "pid"
    wait_until(lambda: pid_file.exists() and bool(pid_file.read_text()), "the attempt to start", timeout=60)
    return int(pid_file.read_text())


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _assert_cancelled_and_gone(out: Path, child: int) -> dict[str, Any]:
    doc = json.loads((out / "run.json").read_text())
    assert doc["state"] == "CANCELLED" and doc["finished_at"] is not None
    [row] = doc["attempts"]  # no restart after the cancel
    assert row["attempt_id"] == "task-000" and row["state"] == "CANCELLED"
    assert row["exit_code"] is not None and row["finished_at"] is not None
    assert [(e["type"], e["message"]) for e in doc["events"]][-2:] == [
        ("ATTEMPT_FINISHED", f"task-000 finished CANCELLED (exit {row['exit_code']})"),
        ("RUN_CANCELLED", "run cancelled (task-000 stopped)"),
    ]
    assert not pid_alive(child)
    return doc


@pytest.fixture(autouse=True)
def _sigterm_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drivers started here inherit it."""
    monkeypatch.setenv("FLASHML_PREEMPT_SIGNAL", "none")


@pytest.fixture
def reap() -> Any:
    """Kills, at the end, every attempt pid a failing test left behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminating_signal_during_submit_settles_the_run_then_ends_the_process(
    tmp_path: Path, signum: int, reap: list[int]
) -> None:
    out = tmp_path / "out"
    driver = _start(INLINE, out)
    try:
        reap.append(child := _attempt_pid(out))
        driver.send_signal(signum)
    finally:
        stdout, stderr = _finish(driver)
    assert driver.returncode == -signum, stderr  # a shell reports 128 + signum, as without a run
    assert "submit returned" not in stdout and "Traceback" not in stderr
    _assert_cancelled_and_gone(out, child)


def test_sigterm_to_the_submit_cli_settles_the_run_then_ends_the_cli(tmp_path: Path, reap: list[int]) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "sleeper.py").write_text(SLEEPER)
    cli = subprocess.Popen([PY, "-m", "flashruntime.cli", "submit", f"{PY} sleeper.py", "--source", str(src),
                            "--output-dir", str(out), "--no-watch"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        reap.append(child := _attempt_pid(out))
        cli.send_signal(signal.SIGTERM)
    finally:
        _, stderr = _finish(cli)
    assert cli.returncode == -signal.SIGTERM, stderr
    _assert_cancelled_and_gone(out, child)


def test_a_script_ending_with_a_wait_false_run_going_cancels_it(tmp_path: Path, reap: list[int]) -> None:
    out = tmp_path / "out"
    script = _start(ENDS_EARLY, out)
    stdout, stderr = _finish(script)
    reap.append(child := _attempt_pid(out))
    assert script.returncode == 0, stderr
    assert "script ends" in stdout
    assert f"the run in {out} is still running (submit(wait=False)); cancelling it" in stderr
    _assert_cancelled_and_gone(out, child)


def test_once_its_runs_ended_the_process_still_dies_of_sigterm(tmp_path: Path) -> None:
    script = _start(AFTER_THE_RUN, tmp_path / "out")
    try:
        assert script.stdout is not None and script.stdout.readline() == "ready\n"
        script.send_signal(signal.SIGTERM)
    finally:
        _, stderr = _finish(script)
    assert script.returncode == -signal.SIGTERM, stderr
    assert json.loads((tmp_path / "out" / "run.json").read_text())["state"] == "SUCCEEDED"


def test_a_handler_of_the_users_own_is_left_to_decide(tmp_path: Path, reap: list[int]) -> None:
    out = tmp_path / "out"
    driver = _start(OWN_HANDLER, out)
    try:
        reap.append(child := _attempt_pid(out))
        driver.send_signal(signal.SIGTERM)
    finally:
        _, stderr = _finish(driver)
    assert driver.returncode == 3, stderr  # the user's SystemExit(3), after the run was settled
    _assert_cancelled_and_gone(out, child)


def test_inline_submit_puts_the_default_handlers_back_and_leaves_others_alone(tmp_path: Path) -> None:
    script = _start(HANDLERS, tmp_path / "out")
    stdout, stderr = _finish(script)
    assert script.returncode == 0, stderr
    assert stdout.splitlines() == ["True True"]


def test_a_forked_child_dies_of_sigterm_without_touching_the_parents_run(tmp_path: Path, reap: list[int]) -> None:
    out = tmp_path / "out"
    script = _start(FORKED, out)
    stdout, stderr = _finish(script)
    reap.append(_attempt_pid(out))
    assert script.returncode == 0, stderr
    assert stdout.splitlines() == ["True default RUNNING"]


# The main thread floods a pipe nobody reads, so it sits blocked in a write when SIGTERM comes.
FLOODS_STDOUT = PRELUDE + """
run = flash.submit(sleeper, output_dir=out, watch=False, wait=False)
while True:
    print("x" * 1000)
"""

# The attempt ignores SIGTERM, so cancelling it takes the grace period (made far longer than
# any test waits); a Ctrl-C lands in it.
LONG_GRACE = """
from flashruntime.launchers.local import LocalProcessLauncher
LocalProcessLauncher.__init__.__kwdefaults__["term_grace_s"] = 600.0
"""

# wait=False: the script catches the Ctrl-C (as a notebook or a REPL would) and carries on.
INTERRUPTED_CANCEL = PRELUDE + LONG_GRACE + """
stubborn = flash.CommandWorkload(command=[sys.executable, "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + {sleeper!r}])
run = flash.submit(stubborn, output_dir=out, watch=False, wait=False)
try:
    run.wait()
except KeyboardInterrupt:
    print("interrupted", flush=True)
while True:
    time.sleep(0.1)
""".replace("{sleeper!r}", repr(SLEEPER))


def test_sigterm_while_the_main_thread_is_blocked_writing_still_ends_the_process(
    tmp_path: Path, reap: list[int]
) -> None:
    """Dying of the signal flushes nothing, as the default action: a flush of the stdout whose
    write the signal interrupted blocked on the full pipe, or raised a reentrancy error."""
    out = tmp_path / "out"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # a buffered stdout
    driver = subprocess.Popen([PY, "-c", FLOODS_STDOUT, str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env)
    try:
        reap.append(child := _attempt_pid(out))
        wait_until(lambda: driver.poll() is None, "the driver to run", timeout=5)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=60) == -signal.SIGTERM  # stdout is not read until it died
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.communicate()
    _assert_cancelled_and_gone(out, child)


# The same stubborn attempt under submit(wait=True): the SIGTERM interrupts the drive loop
# itself, and the Ctrl-C lands in its cancel.
INTERRUPTED_INLINE_CANCEL = PRELUDE + LONG_GRACE + """
stubborn = flash.CommandWorkload(command=[sys.executable, "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + {sleeper!r}])
flash.submit(stubborn, output_dir=out, watch=False)
""".replace("{sleeper!r}", repr(SLEEPER))


# The attempt's leader (a shell) dies of the SIGTERM at once; the child it started ignores it.
# Settling the exited leader sweeps the child with the grace period: the Ctrl-C must cut that too.
INTERRUPTED_SETTLE = PRELUDE + LONG_GRACE + """
stubborn = flash.CommandWorkload(command=["sh", "-c", '"$0" -c "$1"; echo leader done', sys.executable,
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + {sleeper!r}])
run = flash.submit(stubborn, output_dir=out, watch=False, wait=False)
run.wait()
""".replace("{sleeper!r}", repr(SLEEPER))


@pytest.mark.parametrize("script", [INTERRUPTED_CANCEL, INTERRUPTED_INLINE_CANCEL, INTERRUPTED_SETTLE],
                         ids=["wait=False", "wait=True", "the leader exited"])
def test_a_ctrl_c_during_the_cancel_of_a_sigterm_kills_the_attempt_at_once_and_ends_the_process(
    tmp_path: Path, reap: list[int], script: str
) -> None:
    """The Ctrl-C says hurry: the attempt that ignores SIGTERM is killed without waiting out
    the grace period, the run is settled, and the process dies of the SIGTERM."""
    out = tmp_path / "out"
    driver = _start(script, out)
    try:
        reap.append(child := _attempt_pid(out))
        driver.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the cancel is now waiting out the stubborn attempt's grace period
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=60) == -signal.SIGTERM
    finally:
        _, stderr = _finish(driver)
    assert "Traceback" not in stderr
    doc = _assert_cancelled_and_gone(out, child)
    if script is not INTERRUPTED_SETTLE:  # there the leader died of the SIGTERM itself
        assert doc["attempts"][0]["exit_code"] == -signal.SIGKILL  # killed, not waited for


# The main thread is cancelling the run itself (its attempt ignores SIGTERM, so the cancel
# waits out the grace period) when a SIGTERM comes: it must not wait for that cancel to end.
SIGTERM_DURING_OWN_CANCEL = PRELUDE + """
from flashruntime.launchers.local import LocalProcessLauncher
LocalProcessLauncher.__init__.__kwdefaults__["term_grace_s"] = 5.0
stubborn = flash.CommandWorkload(command=[sys.executable, "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + {sleeper!r}])
run = flash.submit(stubborn, output_dir=out, watch=False, wait=False)
until_the_attempt_runs()
open(os.path.join(out, "cancelling"), "w").close()
run.cancel()
run.wait()
""".replace("{sleeper!r}", repr(SLEEPER))


def test_a_sigterm_during_the_scripts_own_cancel_ends_within_the_grace_period(
    tmp_path: Path, reap: list[int]
) -> None:
    out = tmp_path / "out"
    driver = _start(SIGTERM_DURING_OWN_CANCEL, out)
    try:
        reap.append(child := _attempt_pid(out))
        wait_until(lambda: (out / "cancelling").exists(), "the script's cancel", timeout=60)
        time.sleep(1.0)  # inside the cancel's 5 s grace period
        driver.send_signal(signal.SIGTERM)
        # Before: the guard skipped the cancel already asked for, waited 60 s for the run, then cancelled again.
        assert driver.wait(timeout=40) == -signal.SIGTERM
    finally:
        _, stderr = _finish(driver)
    assert "Traceback" not in stderr
    _assert_cancelled_and_gone(out, child)


# The main thread holds the run's lock while the drive thread launches the attempt. The launch
# is held back until the main thread has the lock, and the main thread waits for the spawn (5 s
# at most: with the lock held across the launch, the drive thread cannot begin it).
LAUNCH_UNDER_THE_LOCK = PRELUDE + """
import os, threading
from flashruntime.launchers.local import LocalProcessLauncher
spawn = LocalProcessLauncher.launch
holding, spawned = threading.Event(), threading.Event()
def launch(self, *args, **kwargs):
    holding.wait(5)
    handle = spawn(self, *args, **kwargs)
    spawned.set()
    return handle
LocalProcessLauncher.launch = launch
run = flash.submit(sleeper, output_dir=out, watch=False, wait=False)
with run._lock:
    holding.set()
    spawned.wait(5)
    open(os.path.join(out, "holding"), "w").close()
    time.sleep(300)
"""


def _attempt_processes(attempt_dir: Path) -> list[int]:
    """Live processes whose environment names ``attempt_dir`` as their FLASHML_OUTPUT_DIR."""
    marker = f"FLASHML_OUTPUT_DIR={attempt_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                running = (entry / "stat").read_text().split()[2] != "Z"
            except OSError:
                continue
            if marker in environ and running:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="lists processes through /proc")
def test_an_attempt_launched_while_the_main_thread_holds_the_runs_lock_is_never_orphaned(tmp_path: Path) -> None:
    out = tmp_path / "out"
    driver = _start(LAUNCH_UNDER_THE_LOCK, out)
    try:
        wait_until(lambda: (out / "holding").exists(), "the lock to be held", timeout=60)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=60) == -signal.SIGTERM
    finally:
        _, stderr = _finish(driver)
    leftovers = _attempt_processes(out / "local" / "task-000")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers == [], stderr  # before: spawned, then no handle recorded, so nothing stopped it
    doc = json.loads((out / "run.json").read_text())
    assert doc["state"] == "CANCELLED"
    assert all(row["state"] == "CANCELLED" and row["exit_code"] is not None for row in doc["attempts"])


# A signal lands while run.json is being written with the attempt's end or the run's end (the
# write wrapped to send it then): the record is made once, and the file ends as the run did.
SIGNAL_DURING_THE_WRITE = PRELUDE + """
from flashruntime.local.run import Run
write = Run._write
fired = []
def _write(self):
    if not fired and self._events and self._events[-1]["type"] == EVENT:
        fired.append(True)
        os.kill(os.getpid(), SIGNAL)
    write(self)
Run._write = _write
try:
    flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", COMMAND]), output_dir=out, watch=False)
except KeyboardInterrupt:
    pass
"""


@pytest.mark.parametrize(
    ("event", "signum", "command", "ctrl_c_first"),
    [("ATTEMPT_FINISHED", signal.SIGINT, "print('done')", False),
     ("RUN_CANCELLED", signal.SIGTERM, SLEEPER, True)],
    ids=["ctrl-c while the attempt's end is written", "sigterm while a ctrl-c's cancel is written"],
)
def test_a_signal_during_the_write_of_a_record_neither_repeats_nor_loses_it(
    tmp_path: Path, reap: list[int], event: str, signum: int, command: str, ctrl_c_first: bool
) -> None:
    out = tmp_path / "out"
    script = f"EVENT, SIGNAL, COMMAND = {event!r}, {int(signum)}, {command!r}\n" + SIGNAL_DURING_THE_WRITE
    driver = _start(script, out)
    try:
        if ctrl_c_first:
            reap.append(_attempt_pid(out))
            driver.send_signal(signal.SIGINT)
    finally:
        _finish(driver)
    doc = json.loads((out / "run.json").read_text())
    assert doc["state"] == "CANCELLED"
    types = [e["type"] for e in doc["events"]]
    assert types.count("ATTEMPT_FINISHED") == 1 and types.count("RUN_CANCELLED") == 1, types
    assert types[-1] == "RUN_CANCELLED"


# The main thread holds the run's lock when SIGTERM comes, as a loop reading run.attempts
# does nearly all the time: the drive loop cannot record the cancelled attempt's end.
HOLDS_THE_RUNS_LOCK = PRELUDE + """
run = flash.submit(sleeper, output_dir=out, watch=False, wait=False)
until_the_attempt_runs()
with run._lock:
    open(os.path.join(out, "holding"), "w").close()
    time.sleep(300)
"""


def test_sigterm_while_the_main_thread_holds_the_runs_lock_settles_the_run_in_full(
    tmp_path: Path, reap: list[int]
) -> None:
    out = tmp_path / "out"
    driver = _start(HOLDS_THE_RUNS_LOCK, out)
    try:
        reap.append(child := _attempt_pid(out))
        wait_until(lambda: (out / "holding").exists(), "the lock to be held", timeout=60)
        driver.send_signal(signal.SIGTERM)
        # Before: the guard waited 60 s for the blocked drive loop, then settled the row without an exit code.
        assert driver.wait(timeout=45) == -signal.SIGTERM
    finally:
        _, stderr = _finish(driver)
    assert "Traceback" not in stderr
    doc = _assert_cancelled_and_gone(out, child)
    assert doc["attempts"][0]["exit_code"] == -signal.SIGTERM


# The attempt ends by itself; reading its log for the record is slow, and SIGTERM lands then.
SLOW_RECORD = PRELUDE + """
from flashruntime.launchers.local import LocalLaunchHandle
read_logs = LocalLaunchHandle.logs
def slow_logs(self, *args, **kwargs):
    open(os.path.join(out, "recording"), "w").close()
    time.sleep(2.0)
    return read_logs(self, *args, **kwargs)
LocalLaunchHandle.logs = slow_logs
flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", "print('done')"]), output_dir=out, watch=False)
"""


def test_a_sigterm_while_a_finished_attempt_is_recorded_leaves_its_row_settled(tmp_path: Path) -> None:
    out = tmp_path / "out"
    driver = _start(SLOW_RECORD, out)
    try:
        wait_until(lambda: (out / "recording").exists(), "the attempt to end", timeout=60)
        driver.send_signal(signal.SIGTERM)
    finally:
        _, stderr = _finish(driver)
    assert driver.returncode == -signal.SIGTERM, stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["state"] == "CANCELLED"
    [row] = doc["attempts"]
    assert (row["state"], row["exit_code"]) == ("SUCCEEDED", 0) and row["finished_at"] is not None
    assert [(e["type"], e["message"]) for e in doc["events"]][-2:] == [
        ("ATTEMPT_FINISHED", "task-000 finished SUCCEEDED (exit 0)"),
        ("RUN_CANCELLED", "run cancelled"),
    ]


# The launch is slowed after the spawn, so that SIGTERM lands between the spawn and the
# attempt's row in run.json.
SLOW_LAUNCH = PRELUDE + """
from flashruntime.launchers.local import LocalProcessLauncher
spawn = LocalProcessLauncher.launch
def slow_launch(self, *args, **kwargs):
    handle = spawn(self, *args, **kwargs)
    open(os.path.join(out, "spawned"), "w").close()
    time.sleep(2.0)
    return handle
LocalProcessLauncher.launch = slow_launch
flash.submit(sleeper, output_dir=out, max_restarts=2, watch=False)
"""


def test_a_sigterm_during_the_launch_waits_for_the_attempts_row(tmp_path: Path, reap: list[int]) -> None:
    out = tmp_path / "out"
    driver = _start(SLOW_LAUNCH, out)
    try:
        reap.append(child := _attempt_pid(out))
        wait_until(lambda: (out / "spawned").exists(), "the spawn", timeout=60)
        driver.send_signal(signal.SIGTERM)  # inside the launch: the row does not exist yet
    finally:
        _, stderr = _finish(driver)
    assert driver.returncode == -signal.SIGTERM, stderr
    _assert_cancelled_and_gone(out, child)  # one attempt row, settled CANCELLED with its exit code
