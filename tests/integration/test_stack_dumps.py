"""Stack dumps of real processes: the rank's own faulthandler dump when py-spy is not used,
py-spy on a running and on a stopped process, and stopping a stopped process at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashruntime.monitor.hang_watch import stop_processes
from flashruntime.monitor.stacks import dump_stacks, py_spy_path, render_stacks
from tests._support import REPO_ROOT

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flashruntime.torch import _hang

    ranks = Path(sys.argv[1])
    _hang.arm(ranks, 1, ranks / "rank-1.json")
    print("armed" if _hang.dump_armed() else "not armed", flush=True)


    def stuck_in_here():
        time.sleep(600)


    stuck_in_here()
""")


@pytest.fixture
def child(tmp_path: Path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(ranks)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "armed"
        yield process, ranks
    finally:
        process.kill()
        process.wait()


def test_a_rank_dumps_its_own_stack_and_goes_on(child) -> None:
    process, ranks = child
    time.sleep(0.2)  # into stuck_in_here
    [stack] = dump_stacks({process.pid: 1}, ranks, use_py_spy=False)
    assert stack.method == "faulthandler" and stack.rank == 1
    assert "stuck_in_here" in stack.text and "Current thread" in stack.text
    assert process.poll() is None  # still running
    again = dump_stacks({process.pid: 1}, ranks, use_py_spy=False)[0]
    assert again.method == "faulthandler" and again.text.count("stuck_in_here") == 1  # only the new dump


def test_a_process_without_the_helper_and_without_py_spy_says_why(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        [stack] = dump_stacks({process.pid: 0}, tmp_path, use_py_spy=False, self_dump_wait_s=0.5)
    finally:
        process.kill()
        process.wait()
    assert stack.method == "none" and stack.text.startswith("no stack: py-spy not used; no dump of its own either")
    rendered = render_stacks([stack], "header")
    assert rendered.startswith("header\n\n===== rank 0 (pid ") and "— none =====" in rendered


def test_py_spy_reads_a_running_and_a_stopped_rank(child) -> None:
    if py_spy_path() is None:
        pytest.skip("py-spy is not installed (the monitor extra)")
    process, ranks = child
    time.sleep(0.2)
    [running] = dump_stacks({process.pid: 1}, ranks)
    assert running.method == "py-spy" and "stuck_in_here" in running.text
    os.kill(process.pid, signal.SIGSTOP)  # a stopped rank runs no handler; py-spy reads it without pausing it
    [stopped] = dump_stacks({process.pid: 1}, ranks)
    assert stopped.method == "py-spy --nonblocking" and "stuck_in_here" in stopped.text


def test_a_rank_that_ends_says_so_in_its_heartbeat(tmp_path: Path) -> None:
    heartbeat = tmp_path / "rank-0.json"
    heartbeat.write_text(json.dumps({"rank": 0, "step": 7, "ts": 1.0}))
    code = ("import sys; from pathlib import Path; from flashruntime.torch import _hang; "
            "_hang.arm(Path(sys.argv[1]), 0, Path(sys.argv[1]) / 'rank-0.json')")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                   check=True, timeout=60)
    assert json.loads(heartbeat.read_text()) == {"rank": 0, "step": 7, "ts": 1.0, "exiting": True}


def test_a_stopped_process_is_ended_without_waiting_for_sigkill(child) -> None:
    process, _ = child
    os.kill(process.pid, signal.SIGSTOP)

    def find() -> set[int]:
        return set() if process.poll() is not None else {process.pid}

    stop_processes(find, grace_s=60.0)
    assert process.poll() == -signal.SIGTERM  # the SIGTERM took effect once continued, long before the grace
