"""A permitted command job turned hostile cannot take the node's credential, nor use one.

A real coordinator process with node, submitter and operator tokens; real ``flashruntime
worker`` processes whose node token is everywhere a careless worker would leave it (its
command line, its environment, a token file). Alice holds the code-execution grant; her job
(``hostile_task.py``) scans every ``/proc/*/environ`` and ``cmdline`` it can see, the worker's
own by pid, the token file, the work root; then, with whatever it found and with nothing,
tries to register as a node of bob's pool, claim bob's task, read his private input and
commit a result of its own. Bob's job then runs on his own worker and its result is his.
Under ``--runner sandboxed`` and under ``--runner trusted`` (its light namespace).
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.sandbox import probe_bwrap
from tests.service_server import CoordinatorProcess, process_env, stop_process

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

HOSTILE = Path(__file__).with_name("hostile_task.py")
NODE_TOKEN, BOB_NODE_TOKEN = secrets.token_hex(16), secrets.token_hex(16)
ALICE_TOKEN, BOB_TOKEN, ROOT_TOKEN = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
SECRETS = (NODE_TOKEN, BOB_NODE_TOKEN, ALICE_TOKEN, BOB_TOKEN, ROOT_TOKEN)
COORDINATOR_ENV = {
    "FLASHML_NODE_TOKENS": f"box-1:{NODE_TOKEN},box-2:{BOB_NODE_TOKEN}",
    "FLASHML_SUBMITTER_TOKENS": f"alice:{ALICE_TOKEN},bob:{BOB_TOKEN}",
    "FLASHML_OPERATOR_TOKENS": f"root:{ROOT_TOKEN}",
    "FLASHML_ARGV_SUBMITTERS": "alice,bob",
    # box-1 may serve bob's pool too: its token alone is what keeps a job of team-a off bob's task.
    "FLASHML_NODE_POOLS": "box-1:team-a|team-b,box-2:team-b",
    "FLASHML_UNSANDBOXED_NODES": "box-1,box-2",
}
PRIVATE = b"bob's private figures: 42\n"
# Bob's own program: what his job's result must be.
BOB_PROGRAM = ("import hashlib, json, os; data = open(json.load(open(os.environ['FLASHML_INPUTS_FILE']))['private'], "
               "'rb').read(); json.dump(dict(owner='bob', private_sha256=hashlib.sha256(data).hexdigest()), "
               "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")

BWRAP = probe_bwrap()
needs_bwrap = pytest.mark.skipif(not BWRAP.works, reason=f"bubblewrap does not work here: {BWRAP.reason}")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def command_job(command: list[str], pool: str, runner: str, **parameters: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": f"{pool}-job"},
        "spec": {
            "execution": {"backend": "leases"}, "image": {"repository": "local/train", "tag": "1"},
            "workload": {"type": "command", "parameters": {"command": command, **parameters}},
            # The trusted runner takes sandboxed-tier commands only through the team-pool waiver.
            "isolation": {"tier": "sandboxed", "allowFallback": runner == "trusted"},
            "placement": {"pool": pool},
            "retryPolicy": {"maxTaskAttempts": 1},
        },
    }


def start_worker(url: str, work_dir: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(work_dir),
         "--poll-seconds", "0.2", "--max-tasks", "1", *options],
        env=process_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(worker: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        log, _ = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        log = stop_process(worker)
    return worker.returncode, log


def wait_terminal(api: Any, job_id: str, token: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (job := api.get(f"/v1alpha1/jobs/{job_id}", headers=auth(token)).json())["state"] in ("RUNNING", "PENDING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def token_file(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@needs_bwrap
@pytest.mark.parametrize("runner", ["sandboxed", "trusted"])
def test_a_hostile_command_job_finds_no_credential_and_cannot_take_another_job(tmp_path: Path, runner: str) -> None:
    coordinator = CoordinatorProcess(tmp_path / "data", env=COORDINATOR_ENV).start()
    hints = tmp_path / "hints"
    hints.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    # One probe under /tmp (the sandbox's /tmp is its own), one on the disk the sandbox shows
    # read-only: beside the Python installation, which every sandbox binds back read-only.
    probes = [outside / "written-by-a-task", Path(sys.prefix) / f"flashruntime-hostile-{secrets.token_hex(4)}"]
    (tmp_path / "secrets").mkdir()
    secret_file = token_file(tmp_path / "secrets" / "node-token", NODE_TOKEN)
    try:
        with httpx.Client(base_url=coordinator.url, timeout=30) as api:
            stored = api.put("/v1alpha1/artifacts/users/bob/private.txt", content=PRIVATE, headers=auth(BOB_TOKEN))
            assert stored.status_code in (200, 201), stored.text
            bob = api.post("/v1alpha1/jobs", headers=auth(BOB_TOKEN), json=command_job(
                [sys.executable, "-c", BOB_PROGRAM], "team-b", runner,
                inputs={"private": "artifact://users/bob/private.txt"}))
            assert bob.status_code == 201, bob.text
            alice = api.post("/v1alpha1/jobs", headers=auth(ALICE_TOKEN), json=command_job(
                [sys.executable, str(HOSTILE), coordinator.url, str(secret_file), *map(str, probes)], "team-a", runner,
                local_inputs=["hints"]))
            assert alice.status_code == 201, alice.text
            bob_id, alice_id = bob.json()["job_id"], alice.json()["job_id"]

            # The attacker's worker: the token on its command line, in its environment, in a file.
            worker = start_worker(coordinator.url, tmp_path / "work-a", "--node-id", "box-1", "--token", NODE_TOKEN,
                                  "--token-file", str(secret_file), "--runner", runner, "--pools", "team-a",
                                  "--dataset", f"hints={hints}", env={"FLASHML_NODE_TOKEN": NODE_TOKEN})
            (hints / "worker.pid").write_text(str(worker.pid))
            code, log = finish(worker)
            assert code == 0, log
            assert wait_terminal(api, alice_id, ALICE_TOKEN)["state"] == "SUCCEEDED", log
            found = api.get(f"/v1alpha1/artifacts/jobs/{alice_id}/task-000/metrics.json", headers=auth(ALICE_TOKEN))
            assert found.status_code == 200, found.text
            report = found.json()

            # It looked, and saw nothing of the worker's: no credential anywhere it could read.
            assert report["processes"], report  # it could list its own processes
            assert any(entry["environ"] == "read" for entry in report["processes"].values()), report
            for secret in SECRETS:
                assert secret not in found.text, "a credential reached the task"
            assert report["candidates"] == [], report
            assert not any("flashruntime.cli" in entry["cmdline"] for entry in report["processes"].values()), report
            assert report["worker_pid"] == str(worker.pid)
            assert report["worker_environ"] != "read" and report["worker_cmdline"] != "read", report
            assert report["token_file"] != "read" or NODE_TOKEN not in found.text
            assert not [name for name in report["own_environment_names"] if "TOKEN" in name or "JOIN" in name]
            # Its log as the worker uploaded it holds nothing of the worker's either: the lease
            # directory, where the worker reads it, is read-only to the task.
            assert report["log_swapped"] != "swapped", report
            task_log = api.get(f"/v1alpha1/artifacts/jobs/{alice_id}/task-000/task.log", headers=auth(ALICE_TOKEN))
            assert task_log.status_code in (200, 404), task_log.text
            assert not any(secret in task_log.text for secret in SECRETS)
            # Other leases' directories and the worker's journal are out of sight.
            assert all(entry.startswith(alice_id) for entry in report["work_root_entries"]), report
            # With nothing to use, every step against bob's job was refused.
            assert len(report["attempts"]) == 1, report
            for attempt in report["attempts"]:
                assert attempt["claim"] in (0, 401, 403), attempt
                assert attempt["register"] in (0, 401, 403), attempt
                assert attempt["bob_input_direct"] in (0, 401, 403), attempt
            if runner == "sandboxed":
                assert report["coordinator_reachable"] is False, report
                assert report["writes"][str(probes[1])] == "EROFS", report
                assert not any(probe.exists() for probe in probes)
            else:  # the trusted runner shares the network and the filesystem, as it says
                assert report["coordinator_reachable"] is True, report
                assert all(probe.exists() for probe in probes)
            assert bob_id not in log

            # Bob's job, untouched, runs on his own worker: its result is his program's.
            code, log = finish(start_worker(coordinator.url, tmp_path / "work-b", "--node-id", "box-2",
                                            "--token-file", str(token_file(tmp_path / "bob-node", BOB_NODE_TOKEN)),
                                            "--runner", runner, "--pools", "team-b"))
            assert code == 0, log
            assert wait_terminal(api, bob_id, BOB_TOKEN)["state"] == "SUCCEEDED", log
            result = api.get(f"/v1alpha1/artifacts/jobs/{bob_id}/task-000/metrics.json", headers=auth(BOB_TOKEN))
            assert result.json() == {"owner": "bob", "private_sha256": hashlib.sha256(PRIVATE).hexdigest()}
    finally:
        coordinator.stop()
        probes[1].unlink(missing_ok=True)
