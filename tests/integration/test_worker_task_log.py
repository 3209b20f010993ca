"""The worker uploads each task's log as ``task.log`` under the task's output prefix: while the
task runs (so ``logs --follow`` shows it), and bounded to its last ``TASK_LOG_MAX_BYTES``. A
real worker agent against the stdlib fake coordinator on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashruntime.protocol.task_logs import (
    TASK_LOG_CUT_LINE,
    TASK_LOG_MAX_BYTES,
    bounded_log,
    last_lines,
    task_log_key,
    was_cut,
)
from tests.integration.test_service_worker import FAST, argv_payload, make_agent, run_agent
from tests.worker_fake_coordinator import FakeCoordinator

LOG_KEY = "jobs/job1/task-000/task.log"
# Prints a line, then waits (a hang guard bounds it) for the test to see that line on the
# coordinator: only an upload during the run can show it.
WAIT_FOR_RELEASE = """
import json, os, pathlib, sys, time
print("early-marker-7f3a", flush=True)
release = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
print("released" if release.exists() else "gave up", flush=True)
json.dump({"ok": 1}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    fake = FakeCoordinator()
    fake.start()
    yield fake
    fake.stop()


def test_a_running_tasks_log_is_uploaded_before_it_ends_and_again_when_it_ends(
        coordinator: FakeCoordinator, tmp_path: Path) -> None:
    release = tmp_path / "release"
    payload = argv_payload(WAIT_FOR_RELEASE)
    payload["argv"] = [*payload["argv"], str(release)]
    lease_id = coordinator.add_lease(payload)
    agent = make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1,
                       timing=dataclasses.replace(FAST, log_upload_s=0.1))

    def seen_early() -> bool:
        with coordinator.lock:
            return b"early-marker-7f3a" in coordinator.artifacts.get(LOG_KEY, b"")

    def release_when_seen() -> None:
        if coordinator.wait_for(seen_early, timeout=60):
            release.touch()

    watcher = threading.Thread(target=release_when_seen)
    watcher.start()
    assert run_agent(agent, timeout=90) == 0
    watcher.join()
    assert lease_id in coordinator.completed, coordinator.failed
    assert coordinator.artifacts[LOG_KEY] == b"early-marker-7f3a\nreleased\n"


def test_a_long_log_is_cut_to_its_last_lines_within_the_bound(coordinator: FakeCoordinator, tmp_path: Path) -> None:
    chatty = ("import sys\nfor i in range(200_000): sys.stdout.write(f'line {i:06d} ' + 'x' * 20 + '\\n')\n"
              "sys.exit(1)")
    lease_id = coordinator.add_lease(argv_payload(chatty))
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)) == 0
    assert coordinator.failed[lease_id].startswith("exit 1: line 199999 ")
    log = coordinator.artifacts[LOG_KEY]
    assert len(log) <= TASK_LOG_MAX_BYTES and was_cut(log)
    lines = log.decode().splitlines()
    assert lines[0] == TASK_LOG_CUT_LINE
    assert lines[1].startswith("line ") and len(lines[1]) == len("line 000000 ") + 20  # a whole line
    assert lines[-1].startswith("line 199999 ")


def test_bounded_log_keeps_small_logs_and_cuts_at_a_line() -> None:
    assert bounded_log(b"a\nb\n", 10) == b"a\nb\n"
    data = b"".join(b"%05d\n" % i for i in range(100_000))
    cut = bounded_log(data, 4096)
    assert len(cut) <= 4096 and cut.endswith(b"99999\n") and cut.split(b"\n")[1].isdigit()
    assert bounded_log(data[-4097:], 4096) == cut  # the tail alone gives the same answer
    assert not was_cut(data) and was_cut(cut)
    assert task_log_key("jobs/j/t/") == "jobs/j/t/task.log" == task_log_key("jobs/j/t")
    assert last_lines("a\nb\nc\n", 2) == "b\nc\n" and last_lines("a\nb", 0) == ""
