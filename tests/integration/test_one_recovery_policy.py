"""One recovery policy: the same failure evidence (an exit code and the output before it) gets
the same class and the same retry-or-stop decision from a local run (``flash.submit``), from a
coordinator judging a worker's failed attempt, and from the Ray backend; and a task module's
refusal of its parameters runs once on a real worker agent."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import flashruntime as flash
from flashruntime.coordinator.failures import TASK_MODE
from flashruntime.recovery import judge_exit
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

PY = sys.executable


class Case(NamedTuple):
    name: str
    exit_code: int
    output: str
    failure_class: str
    retried: bool


CASES = [
    Case("task module bad parameter", 1, "sgd_trainer: ValueError: sgd_trainer: params.steps is required\n",
         "application_error", False),
    Case("argparse usage error", 2, "usage: t.py [-h] --lr LR\nt.py: error: argument --lr: invalid float value: 'x'\n",
         "application_error", False),
    Case("NameError traceback", 1, "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                                   "NameError: name 'x' is not defined\n", "application_error", False),
    Case("killed peer under mp.spawn", 1, "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
                                          "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated "
                                          "with signal SIGKILL\n", "worker_crash", True),
    Case("exit 1 with no traceback", 1, "lost the connection to the data server\n", "worker_crash", True),
    Case("a torn checkpoint on load", 1, "Traceback (most recent call last):\n  File \"t.py\", line 4, in <module>\n"
                                         "RuntimeError: PytorchStreamReader failed reading zip archive: failed "
                                         "finding central directory\n", "artifact_corruption", True),
]


def _script(case: Case) -> str:
    return textwrap.dedent(f"""
        import sys
        sys.stderr.write({case.output!r})
        sys.exit({case.exit_code})
    """)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_policy_gives_one_answer_in_either_mode(case: Case) -> None:
    for mode in ("independent_tasks", "coordinated_training"):
        verdict = judge_exit(case.exit_code, case.output, mode)
        assert (str(verdict.failure_class), verdict.retry) == (case.failure_class, case.retried), mode


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_local_run_decides_as_the_table_says(tmp_path: Path, case: Case) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "t.py").write_text(_script(case))
    run = flash.submit(CommandWorkload(command=[PY, "t.py"], source=Source(path=str(source)),
                                       outputs=OutputSpec(collect=[])),
                       output_dir=tmp_path / "run", watch=False, quiet=True, max_restarts=1)
    failure = run.attempts[0]["failure"]
    assert failure["class"] == case.failure_class
    assert len(run.attempts) == (2 if case.retried else 1)


@pytest.mark.service
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_coordinator_judges_a_workers_failed_attempt_as_the_table_says(tmp_path: Path, case: Case) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.service_server import serve_in_thread, settings_for

    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "one-policy"},
           "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                    "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}]}},
                    "retryPolicy": {"maxTaskAttempts": 3}}}
    registration = {"node_id": "node-a", "kubernetes_node": "", "hostname": "a.local", "module_capable": True,
                    "capabilities": {"cpu_cores": 2, "pools": []}}
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        job_id = api.post("/v1alpha1/jobs", json=job).json()["job_id"]
        api.post("/v1alpha1/nodes/register", json=registration)
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        log_key = lease["payload"]["output_prefix"] + "task.log"  # as the agent ships it before it fails
        assert api.put(f"/v1alpha1/artifacts/{log_key}", content=case.output.encode()).status_code == 200
        answer = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail",
                          json={"reason": f"exit {case.exit_code}: last line", "exit_code": case.exit_code})
        assert answer.status_code == 200, answer.text
        events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
        classified = [e for e in events if e["type"] == "FAILURE_CLASSIFIED"]
        assert len(classified) == 1
        data: dict[str, Any] = classified[0]["data"]
        assert (data["failure_class"], data["retried"]) == (case.failure_class, case.retried)
        assert data["evidence"] == judge_exit(case.exit_code, case.output, TASK_MODE).evidence
        task = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]
        assert task["state"] == ("PENDING" if case.retried else "FAILED")


@pytest.mark.service
def test_a_fail_without_an_exit_code_spends_the_budget_as_before(tmp_path: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.service_server import serve_in_thread, settings_for

    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "no-exit-code"},
           "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                    "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}]}},
                    "retryPolicy": {"maxTaskAttempts": 2}}}
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        job_id = api.post("/v1alpha1/jobs", json=job).json()["job_id"]
        api.post("/v1alpha1/nodes/register", json={"node_id": "node-a", "kubernetes_node": "", "hostname": "a",
                                                   "module_capable": True, "capabilities": {"cpu_cores": 2}})
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail",
                        json={"reason": "agent error preparing the task"}).status_code == 200
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail",
                        json={"reason": "x", "exit_code": 999}).status_code == 422  # no such exit code
        stale = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail", json={"reason": "again", "exit_code": 1})
        assert stale.status_code == 410  # the lease ended with the first fail: nothing is judged or kept
        assert not [e for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json() if e["type"] == "FAILURE_CLASSIFIED"]
        keys = [a["key"] for a in api.get(f"/v1alpha1/jobs/{job_id}/artifacts").json()]
        assert not [key for key in keys if "/attempts/" in key]
        assert api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]["state"] == "PENDING"


@pytest.mark.service
def test_a_task_modules_bad_parameter_runs_once_on_a_worker_agent(tmp_path: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from flashruntime.agent.worker import WorkerAgent
    from tests.integration.test_service_worker import FAST, run_agent
    from tests.service_server import serve_in_thread, settings_for

    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "bad-params"},
           "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                    "workload": {"type": "hyperparameter_search",
                                 "parameters": {"module": "sgd_trainer", "trials": [{"lr": 0.1}]}},
                    "retryPolicy": {"maxTaskAttempts": 3}}}
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        job_id = httpx.post(f"{url}/v1alpha1/jobs", json=job, timeout=10).json()["job_id"]
        agent = WorkerAgent(url, node_id="node-real", work_dir=tmp_path / "work", max_tasks=1, poll_seconds=0.05,
                            timing=FAST)
        run_agent(agent, timeout=30)
        events = httpx.get(f"{url}/v1alpha1/jobs/{job_id}/events", timeout=10).json()
        attempts = [e for e in events if e["type"] == "TASK_ATTEMPT_FAILED"]
        classified = [e["data"] for e in events if e["type"] == "FAILURE_CLASSIFIED"]
        assert len(attempts) == 1
        assert [(c["failure_class"], c["retried"]) for c in classified] == [("application_error", False)]
        assert "sgd_trainer refused its task: ValueError" in classified[0]["evidence"]
        status = httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=10).json()
        assert status["state"] == "FAILED"
        assert status["error"].startswith("1 task(s) failed; trial-000: attempt 1 of task trial-000: application_error "
                                          "(sgd_trainer refused its task: ValueError) -> fail_job")


@pytest.mark.service
def test_logs_keep_every_attempt_of_a_retried_task(tmp_path: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.service_server import serve_in_thread, settings_for

    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "retried"},
           "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                    "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}]}},
                    "retryPolicy": {"maxTaskAttempts": 3}}}
    registration = {"node_id": "node-a", "kubernetes_node": "", "hostname": "a", "module_capable": True,
                    "capabilities": {"cpu_cores": 2}}
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        job_id = api.post("/v1alpha1/jobs", json=job).json()["job_id"]
        api.post("/v1alpha1/nodes/register", json=registration)
        for attempt in (1, 2):
            lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
            log_key = lease["payload"]["output_prefix"] + "task.log"
            api.put(f"/v1alpha1/artifacts/{log_key}", content=f"attempt {attempt} lost its server\n".encode())
            api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail", json={"reason": "exit 1", "exit_code": 1})
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        api.put(f"/v1alpha1/artifacts/{lease['payload']['output_prefix']}task.log", content=b"attempt 3 running\n")
        answer = api.get(f"/v1alpha1/jobs/{job_id}/logs").json()
        assert [(t["attempt"], t["state"], t["log"]) for t in answer["tasks"]] == [
            (1, "FAILED", "attempt 1 lost its server\n"), (2, "FAILED", "attempt 2 lost its server\n"),
            (None, "LEASED", "attempt 3 running\n")]
        assert answer["logs"].startswith("--- trial-000 attempt 1 (FAILED) ---\nattempt 1 lost its server\n")
