"""``flash.submit(executor="ray")`` against a real local Ray: a sweep's trials run as Ray tasks
(as many at once as the cluster has CPUs) and are collected as trials of the same ``run.json``;
a single command is one Ray task; a restart follows the recovery policy; a cancel stops the
attempt's processes."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import flashruntime as flash
from flashruntime.errors import InvalidSubmission
from flashruntime.workloads.command import CommandWorkload, Source
from tests._support import pid_alive, wait_until
from tests.ray_cluster import RAY_CPUS

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRIAL = ("import json, os, sys, time; x = float(sys.argv[1]); time.sleep(0.3); print('trial', x); "
         "json.dump(dict(loss=(x - 2) ** 2, pid=os.getpid(), attempt=os.environ['FLASHML_ATTEMPT_ID']), "
         "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")


def workload(tmp_path: Path, program: str, *args: str, params: list[dict[str, Any]] | None = None) -> CommandWorkload:
    return CommandWorkload(command=[sys.executable, "-c", program, *args], source=Source(path=str(tmp_path)),
                           task_params=params)


def test_a_six_trial_sweep_runs_as_ray_tasks_into_one_run_json(ray_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = flash.submit(workload(tmp_path, TRIAL, "{x}", params=[{"x": x} for x in range(6)]), output_dir=out,
                       executor="ray", ray_address="local", metric="loss", mode="min", quiet=True, watch=False)
    assert str(run.state) == "SUCCEEDED"
    record = json.loads((out / "run.json").read_text())
    trials = record["sweep"]["trials"]
    assert record["sweep"]["max_concurrent_trials"] == RAY_CPUS  # the cluster's width
    assert [trial["state"] for trial in trials] == ["SUCCEEDED"] * 6
    assert [trial["metrics"]["loss"] for trial in trials] == [(x - 2) ** 2 for x in range(6)]
    assert [trial["metrics"]["params"] for trial in trials] == [{"x": x} for x in range(6)]
    assert run.best_trial()["params"] == {"x": 2}
    launched = [event["message"] for event in record["events"] if event["type"] == "LAUNCH_STARTED"]
    assert len(launched) == 6 and all("launched (Ray task " in message for message in launched)
    for index in range(6):  # each trial's own attempt directory, as for a local sweep
        assert (out / f"local-{index:03d}" / f"task-{index:03d}" / "metrics.json").is_file()
    spans = sorted((trial["started_at"], trial["finished_at"]) for trial in trials)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans  # some ran at once


def test_one_command_is_one_ray_task_and_a_failure_restarts_by_the_policy(ray_cluster: Any, tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    program = ("import json, os, sys\n"
               "if not os.path.exists(sys.argv[1]):\n"
               "    open(sys.argv[1], 'w').close(); sys.exit(3)\n"
               "json.dump(dict(loss=0.5), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")
    run = flash.submit(workload(tmp_path, program, str(marker)), output_dir=tmp_path / "run", max_restarts=1,
                       executor="ray", quiet=True, watch=False)
    assert str(run.state) == "SUCCEEDED"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [attempt["state"] for attempt in record["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert record["attempts"][0]["exit_code"] == 3
    assert record["attempts"][0]["failure"]["class"] == "worker_crash"
    assert record["trials"][-1]["loss"] == 0.5


def test_a_killed_ray_worker_is_classified_as_ray_reported_it_and_the_run_restarts(
        ray_cluster: Any, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The first attempt records its Ray worker (its parent) and itself, then hangs.
    program = ("import json, os, sys, time\n"
               "if not os.path.exists(sys.argv[1]):\n"
               "    open(sys.argv[1], 'w').write(f'{os.getppid()} {os.getpid()}'); time.sleep(300)\n"
               "json.dump(dict(loss=0.25), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")
    run = flash.submit(workload(tmp_path, program, str(pids)), output_dir=tmp_path / "run", max_restarts=1,
                       wait=False, executor="ray", quiet=True, watch=False)
    wait_until(lambda: pids.exists() and " " in pids.read_text(), "the first attempt to start", timeout=60)
    worker, child = (int(pid) for pid in pids.read_text().split())
    os.kill(worker, signal.SIGKILL)
    run.wait(timeout=120)
    assert str(run.state) == "SUCCEEDED"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    first = record["attempts"][0]
    assert [attempt["state"] for attempt in record["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert first["failure"]["class"] == "worker_crash"
    assert first["failure"]["evidence"] == "the Ray worker process died"
    assert not pid_alive(child)  # what the dead worker left running was stopped on its node


def test_an_import_error_on_ray_is_not_restarted(ray_cluster: Any, tmp_path: Path) -> None:
    run = flash.submit(workload(tmp_path, "import no_such_module_anywhere"), output_dir=tmp_path / "run",
                       max_restarts=3, executor="ray", quiet=True, watch=False)
    assert str(run.state) == "FAILED"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len(record["attempts"]) == 1
    assert record["attempts"][0]["failure"]["class"] == "application_error"
    assert "ModuleNotFoundError" in record["attempts"][0]["failure"]["exception"]


def test_cancel_stops_the_attempt_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    program = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    run = flash.submit(workload(tmp_path, program, str(pid_file)), output_dir=tmp_path / "run", wait=False,
                       executor="ray", quiet=True, watch=False)
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", "the attempt to start", timeout=60)
    pid = int(pid_file.read_text())
    stopper = threading.Thread(target=run.cancel)
    stopper.start()
    stopper.join(timeout=60)
    run.wait(timeout=60)
    assert str(run.state) == "CANCELLED"
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid)


@pytest.mark.parametrize(("arguments", "words"), [
    ({"executor": "dask"}, "executor must be one of 'local', 'ray'"),
    ({"ray_address": "auto"}, "ray_address is for executor='ray'"),
    ({"executor": "ray", "ray_address": "nowhere"}, "ray_address must be local, auto, ray://host:port or host:port"),
    ({"executor": "ray", "chaos": "chaos"}, "chaos injects faults into local processes"),
])
def test_arguments_that_cannot_describe_a_run_on_ray_are_refused_before_anything_starts(
        tmp_path: Path, arguments: dict[str, Any], words: str) -> None:
    if arguments.get("chaos") == "chaos":
        from flashruntime.local.chaos import ChaosPlan, Fault

        arguments = {**arguments, "chaos": ChaosPlan(faults=[Fault(kind="kill_attempt", at_step=3)])}
    with pytest.raises(InvalidSubmission, match=words.replace("(", r"\(").replace("*", r"\*")):
        flash.submit(workload(tmp_path, "pass"), output_dir=tmp_path / "run", quiet=True, watch=False, **arguments)
    assert not (tmp_path / "run").exists()


def test_an_attempt_that_hangs_on_ray_is_caught_on_its_node_dumped_and_relaunched(
        ray_cluster: Any, tmp_path: Path) -> None:
    marker = tmp_path / "hung-once"
    # Steps to metrics.jsonl; the first attempt stops for good at step 3.
    program = ("import json, os, sys, time\n"
               "out = os.environ['FLASHML_OUTPUT_DIR']\n"
               "first = not os.path.exists(sys.argv[1])\n"
               "open(sys.argv[1], 'a').close()\n"
               "for step in range(1, 6):\n"
               "    open(os.path.join(out, 'metrics.jsonl'), 'a').write(json.dumps(dict(step=step, ts=time.time())) + '\\n')\n"
               "    time.sleep(0.2)\n"
               "    if first and step == 3:\n"
               "        time.sleep(10 ** 6)\n"
               "json.dump(dict(loss=0.5), open(os.path.join(out, 'metrics.json'), 'w'))")
    run = flash.submit(workload(tmp_path, program, str(marker)), output_dir=tmp_path / "run", max_restarts=1,
                       executor="ray", quiet=True, watch=False, hang_timeout_s=3)
    assert str(run.state) == "SUCCEEDED"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    first, second = record["attempts"]
    assert (first["state"], second["state"]) == ("FAILED", "SUCCEEDED")
    assert first["failure"]["class"] == "hang" and first["failure"]["hang"]["last_step"] == 3, first["failure"]
    detected = [event["message"] for event in record["events"] if event["type"] == "HANG_DETECTED"]
    assert len(detected) == 1 and detected[0].startswith("task-000: no progress for"), detected
    stacks = Path(first["failure"]["hang"]["stacks"])
    assert stacks.parent == Path(first["output_dir"]) and "<module> (<string>:9)" in stacks.read_text()
