"""Multi-node jobs in pieces: the command recipe's ``parameters.nodes``, the rendezvous port
stamped at submission, the gang gate, the job's end, and a node's torchrun command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.gang_command import checked_node_addr, gang_argv, gang_env, gang_of, rendezvous_host
from flashruntime.agent.inputs import TaskRefused, lease_dirs
from flashruntime.agent.task_command import build_command, child_env
from flashruntime.coordinator.gangs import is_gang, stamp_rendezvous
from flashruntime.coordinator.lease_jobs import derived_state
from flashruntime.errors import ExpansionError, WorkerConfigError
from flashruntime.protocol.gang import Gang
from flashruntime.protocol.v1alpha1 import JobSpec, JobState, Lease
from flashruntime.recipes.command import CommandRecipe
from flashruntime.scheduler.gates import gate_gang

RECIPE = CommandRecipe()


def spec(**parameters: Any) -> JobSpec:
    params = {"command": ["python", "train.py"], "nodes": {"min": 1, "max": 2}, **parameters}
    params = {key: value for key, value in params.items() if value is not None}
    return JobSpec.model_validate({"metadata": {"name": "nodes"}, "spec": {
        "workload": {"type": "command", "parameters": params},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team"}}})


def test_a_multi_node_job_is_one_task_per_node_each_naming_its_gang() -> None:
    tasks = RECIPE.expand("job1", spec(nproc_per_node=2, checkpoint_dir="/shared/ckpt", max_restarts=5))
    assert [task.task_id for task in tasks] == ["node-000", "node-001"]
    assert RECIPE.task_count(spec().spec.workload.parameters) == 2
    for task in tasks:
        assert task.payload["argv"] == ["python", "train.py"]
        assert task.payload["gang"] == {"run_id": "job1", "min_nodes": 1, "max_nodes": 2, "nproc_per_node": 2,
                                        "max_restarts": 5, "checkpoint_dir": "/shared/ckpt", "last_call_s": 30}
    assert is_gang(spec()) and not is_gang(spec(nodes=None))


@pytest.mark.parametrize(("parameters", "said"), [
    ({"nodes": {"min": 2, "max": 1}}, "1 <= min <= max <= 64"),
    ({"nodes": {"min": 0, "max": 2}}, "1 <= min <= max"),
    ({"nodes": {"min": True, "max": 2}}, "whole numbers"),
    ({"nodes": [1, 2]}, "{'min': MIN, 'max': MAX}"),
    ({"nodes": {"min": 1}}, "{'min': MIN, 'max': MAX}"),
    ({"task_params": [{"lr": 1}]}, "cannot go together"),
    ({"command": ["torchrun", "--nproc-per-node=2", "train.py"]}, "starts a launcher"),
    ({"command": ["python", "-m", "torch.distributed.run", "train.py"]}, "starts a launcher"),
    ({"command": ["bash", "-c", "cd /src && torchrun train.py"]}, "starts a launcher"),
    ({"command": ["python3", "-X", "dev", "-m", "torch.distributed.run", "t.py"]}, "starts a launcher"),
    ({"nproc_per_node": 0}, "nproc_per_node is 0"),
    ({"max_restarts": 1000}, "max_restarts is 1000"),
    ({"checkpoint_dir": "relative/ckpt"}, "absolute path every node sees"),
    ({"last_call_s": 0}, "last_call_s is 0"),
    ({"nodes": None, "nproc_per_node": 2}, "parameters.nproc_per_node is for a multi-node job"),
])
def test_a_malformed_multi_node_job_is_refused_saying_what_to_fix(parameters: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match="parameters") as refused:
        RECIPE.expand("job1", spec(**parameters))
    assert said in str(refused.value)


def test_a_multi_node_job_that_no_worker_could_run_is_refused() -> None:
    sandboxed = spec().model_copy(deep=True)
    sandboxed.spec.isolation.allowFallback = False
    with pytest.raises(ValueError, match="isolation.network: true"):
        RECIPE.expand("job1", sandboxed)
    sandboxed.spec.isolation.network = True
    assert len(RECIPE.expand("job1", sandboxed)) == 2
    shared = spec(checkpoint_dir="/shared/ckpt").model_copy(deep=True)
    shared.spec.isolation.allowFallback = False
    shared.spec.isolation.network = True
    with pytest.raises(ValueError, match="outside every sandbox"):
        RECIPE.expand("job1", shared)
    signed = spec(signature={"format": "x"})
    with pytest.raises(ValueError, match="cannot be signed"):
        RECIPE.expand("job1", signed)


def test_submission_stamps_the_rendezvous_port_or_refuses_without_a_store() -> None:
    tasks = RECIPE.expand("job1", spec())
    with pytest.raises(ExpansionError, match="--rendezvous-port PORT"):
        stamp_rendezvous(tasks, None, "leases")
    with pytest.raises(ExpansionError, match="runs on worker agents"):
        stamp_rendezvous(tasks, 29400, "ray")
    stamp_rendezvous(tasks, 29400, "leases")
    assert {task.payload["gang"]["port"] for task in tasks} == {29400}
    single = RECIPE.expand("job2", spec(nodes=None))
    stamp_rendezvous(single, None, "leases")  # not a multi-node job: nothing to stamp, nothing refused
    assert "gang" not in single[0].payload


def test_the_gang_gate_keeps_a_second_node_of_a_job_off_a_machine_running_one() -> None:
    payload = {"gang": {"run_id": "job1"}}
    assert gate_gang({}, {"node_id": "a"}) is True
    assert gate_gang(payload, {"node_id": "a", "gang_jobs": []}) is True
    assert gate_gang(payload, {"node_id": "a", "gang_jobs": ["job0"]}) is True
    assert gate_gang(payload, {"node_id": "a", "gang_jobs": ["job1"]}) is False
    assert gate_gang({"gang": "job1"}, {"node_id": "a"}) is False  # malformed: fail closed
    assert gate_gang(payload, {"node_id": "a", "gang_jobs": "job1"}) is False
    assert gate_gang(payload, {"node_id": "a"}) is False  # a view that does not say: fail closed


@pytest.mark.parametrize(("counts", "result", "state"), [
    ({"COMPLETED": 1, "CANCELLED": 1}, True, JobState.SUCCEEDED),
    ({"COMPLETED": 1, "FAILED": 1}, True, JobState.SUCCEEDED),  # a node lost on the way, the run done
    ({"COMPLETED": 2}, False, JobState.FAILED),  # every node committed an empty object: no result
    ({"COMPLETED": 1, "FAILED": 1}, False, JobState.FAILED),  # rank 0's node failed after the others left
    ({"COMPLETED": 1, "PENDING": 1}, True, JobState.RUNNING),
    ({"COMPLETED": 1, "LEASED": 1}, True, JobState.RUNNING),
    ({"FAILED": 2}, False, JobState.FAILED),
    ({"CANCELLED": 2}, False, JobState.CANCELLED),
    ({"COMPLETED": 1, "CANCELLED": 1}, None, JobState.CANCELLED),  # not a multi-node job: as before
])
def test_a_multi_node_job_succeeds_only_with_the_runs_metrics(counts: dict[str, int], result: bool | None,
                                                               state: JobState) -> None:
    assert derived_state(counts, gang_result=result) is state


GANG = Gang(run_id="job1", min_nodes=1, max_nodes=2, nproc_per_node=2, port=29400)


def test_a_node_runs_the_command_under_torchrun_on_the_coordinators_store() -> None:
    argv = gang_argv(["/opt/venv/bin/python3", "train.py", "--lr", "0.1"], GANG, "coord.example", "10.0.0.7")
    assert argv == ["/opt/venv/bin/python3", "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
                    "--rdzv-backend=c10d", "--rdzv-endpoint=coord.example:29400", "--rdzv-id=job1",
                    "--rdzv-conf=is_host=0,last_call_timeout=30", "--max-restarts=3", "--local-addr=10.0.0.7",
                    "--no-python", "/opt/venv/bin/python3", "train.py", "--lr", "0.1"]
    grouped = gang_argv(["python", "t.py"], GANG.model_copy(update={"rdzv_id": "job1-5e1f"}), "h")
    assert "--rdzv-id=job1-5e1f" in grouped  # the group the coordinator gave, when it gave one
    # A command that names no Python is run by this agent's, which torchrun needs.
    assert gang_argv(["./train.sh"], GANG, "h")[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert rendezvous_host("https://coord.example:8100/") == "coord.example"
    assert rendezvous_host("http://[::1]:8100") == "[::1]"
    assert gang_env(GANG) == {"FLASHML_MAX_WORLD_SIZE": "4"}
    shared = GANG.model_copy(update={"checkpoint_dir": "/shared/ckpt"})
    assert gang_env(shared)["FLASHML_CKPT_DIR"] == "/shared/ckpt"


def test_a_malformed_gang_or_one_without_a_port_is_refused_by_the_agent() -> None:
    assert gang_of({"argv": ["x"]}) is None
    with pytest.raises(TaskRefused, match="no rendezvous port"):
        gang_of({"gang": GANG.model_copy(update={"port": None}).model_dump()})
    with pytest.raises(TaskRefused, match="gang.max_nodes"):
        gang_of({"gang": {**GANG.model_dump(), "max_nodes": 0}})
    with pytest.raises(TaskRefused, match="min_nodes 3 > max_nodes 2"):
        gang_of({"gang": {**GANG.model_dump(), "min_nodes": 3}})
    assert gang_of({"gang": {**GANG.model_dump(), "added_later": 1}}) == GANG  # the wire grows additively


def test_node_addr_must_be_an_address() -> None:
    assert checked_node_addr(None) is None
    assert checked_node_addr("10.0.0.7") == "10.0.0.7"
    for bad in ("", "a b", "x/y", "h,i"):
        with pytest.raises(WorkerConfigError, match="--node-addr"):
            checked_node_addr(bad)


def test_a_node_of_a_job_with_a_shared_checkpoint_dir_writes_its_checkpoints_there(tmp_path: Path) -> None:
    shared = GANG.model_copy(update={"checkpoint_dir": str(tmp_path / "shared")})
    payload = {"argv": ["python", "train.py"], "env": {"FLASHML_CKPT_DIR": "/elsewhere"},
               "gang": shared.model_dump(), "isolation": {"tier": "sandboxed"}}
    dirs = lease_dirs(tmp_path / "work", "job1", "node-000", "ls-1")
    argv, env = build_command(payload, "trusted", dirs, coordinator_url="http://127.0.0.1:8100")
    assert "--rdzv-endpoint=127.0.0.1:29400" in argv and argv[-2:] == ["python", "train.py"]
    assert env["FLASHML_MAX_WORLD_SIZE"] == "4"
    lease = Lease.model_validate({"lease_id": "ls-1", "task_id": "node-000", "job_id": "job1", "node_id": "a",
                                  "attempt_number": 1, "deadline": "2030-01-01T00:00:00Z", "payload": payload,
                                  "lease_seconds": 60})
    full = child_env(env, dirs, lease, {}, checkpoint_dir=shared.checkpoint_dir)
    assert full["FLASHML_CKPT_DIR"] == str(tmp_path / "shared")  # the job's own env never sets it
    assert child_env(env, dirs, lease, {})["FLASHML_CKPT_DIR"] == str(dirs.ckpt)


def test_a_group_meeting_again_is_not_judged_hung_before_its_rendezvous_can_end() -> None:
    from flashruntime.monitor.hangs import FLOOR_S, METRICS, hang_timeout

    assert GANG.regroup_s == 45.0  # 3 lapsed keep-alives of 5 s, then the 30 s last call
    assert hang_timeout(None, 0.3, METRICS) == FLOOR_S
    assert hang_timeout(None, 0.3, METRICS, FLOOR_S + GANG.regroup_s) == 105.0
    assert hang_timeout(None, 30.0, METRICS, FLOOR_S + GANG.regroup_s) == 300.0  # long steps: the step rule
    assert hang_timeout(20.0, 0.3, METRICS, FLOOR_S + GANG.regroup_s) == 20.0  # a setting wins


def test_a_node_without_metrics_commits_an_empty_object_never_through_a_link(tmp_path: Path) -> None:
    import threading

    from flashruntime.agent.lease_run import LeaseRunner, WorkerTiming

    runner = LeaseRunner(object(), work_root=tmp_path, runner="trusted", datasets={}, timing=WorkerTiming(),
                         stopping=threading.Event())
    dirs = lease_dirs(tmp_path / "work", "job1", "node-001", "ls-2")
    dirs.out.mkdir(parents=True, exist_ok=True)
    assert runner._no_metrics_of_this_node(dirs, dirs.out / "metrics.json") is True
    assert (dirs.out / "metrics.json").read_text() == "{}\n"
    target = tmp_path / "elsewhere"
    (dirs.out / "metrics.json").unlink()
    (dirs.out / "metrics.json").symlink_to(target)  # dangling: the task's name for a file of the agent's choosing
    assert runner._no_metrics_of_this_node(dirs, dirs.out / "metrics.json") is False
    assert not target.exists()
