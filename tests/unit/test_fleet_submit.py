"""``flashruntime submit --api``: which flags the fleet cannot honour (refused, naming the flag,
before anything is sent), the command job it builds, the ``workdir`` parameter from the
recipe to the worker's working directory, and ``GET /v1alpha1/whoami``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashruntime.agent.inputs import LeaseDirs, TaskRefused, task_cwd
from flashruntime.cli.dispatch import main
from flashruntime.cli.fleet_submit import fleet_jobspec
from flashruntime.protocol.v1alpha1 import JobSpec
from flashruntime.recipes.command import CommandRecipe
from flashruntime.workloads.command import CommandWorkload

# Nothing listens here: a refusal must come before any call.
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(("flags", "named"), [
    (["--parallel", "2"], "--parallel"), (["--executor", "ray"], "--executor"), (["--ranks", "1:2"], "--ranks"),
    (["--output-dir", "out"], "--output-dir"), (["--watch"], "--watch"), (["--checkpoint-glob", "a.pt"], "--checkpoint-glob"),
    (["--tensorboard", "tb"], "--tensorboard"), (["--mlflow", "file:///tmp/m"], "--mlflow"),
])
def test_a_flag_the_fleet_cannot_honour_is_refused_by_name(flags: list[str], named: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "python train.py", "--api", NOWHERE, *flags]) == 2
    error = capsys.readouterr().err
    assert f"error: {named} is for local runs and cannot be honoured with --api: " in error
    assert f"; drop {named}" in error


def test_trackers_are_the_coordinators_on_the_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--api", NOWHERE, "submit", "python train.py", "--mlflow", "file:///tmp/m"]) == 2
    assert "the coordinator logs jobs to its trackers (FLASHML_MLFLOW_URI" in capsys.readouterr().err


def test_the_environments_coordinator_is_used_unless_local_is_asked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLASHML_RUNTIME_API", NOWHERE)
    assert main(["submit", "python train.py", "--parallel", "2"]) == 2  # refused as a fleet submission
    assert "--parallel is for local runs" in capsys.readouterr().err
    assert main(["submit", "python train.py", "--local", "--api", NOWHERE]) == 2
    assert "--local and --api contradict each other" in capsys.readouterr().err


def test_pool_without_a_coordinator_is_refused(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLASHML_RUNTIME_API", raising=False)
    assert main(["submit", "python train.py", "--pool", "team-7"]) == 2
    assert "--pool names the team pool of a coordinator's workers; it needs --api URL" in capsys.readouterr().err


def test_an_unreachable_coordinator_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["submit", "python train.py", "--api", NOWHERE]) == 2
    assert f"cannot reach the coordinator at {NOWHERE}" in capsys.readouterr().err


def test_the_job_runs_the_workload_in_its_unpacked_source_with_the_local_restarts(tmp_path: Path) -> None:
    workload = CommandWorkload(command="python train.py --lr {lr}", source={"path": str(tmp_path / "My Project")},
                               task_params=[{"lr": 0.1}, {"lr": 0.01}])
    spec = fleet_jobspec(workload, "artifact://users/alice/sources/ab.tar.gz", pool="team-7", max_restarts=2)
    parsed = JobSpec.model_validate(spec)
    assert parsed.metadata.name == "submit-my-project"
    assert parsed.spec.workload.parameters == {
        "command": ["python", "train.py", "--lr", "{lr}"], "env": {},
        "inputs": {"source": "artifact://users/alice/sources/ab.tar.gz"}, "unpack_inputs": ["source"],
        "workdir": "source", "task_params": [{"lr": 0.1}, {"lr": 0.01}]}
    assert parsed.spec.isolation.tier == "sandboxed" and parsed.spec.isolation.allowFallback
    assert parsed.spec.placement.pool == "team-7"
    assert parsed.spec.retryPolicy.maxTaskAttempts == 3
    tasks = CommandRecipe().expand("j1", parsed)
    assert [task.payload["workdir"] for task in tasks] == ["source", "source"]
    assert [task.payload["argv"][-1] for task in tasks] == ["0.1", "0.01"]


def test_without_a_pool_the_job_waits_for_workers_whose_sandbox_runs_it() -> None:
    spec = JobSpec.model_validate(fleet_jobspec(CommandWorkload(command="python t.py"), "artifact://sources/a.tar.gz",
                                                pool=None, max_restarts=0))
    assert spec.spec.isolation.tier == "sandboxed" and not spec.spec.isolation.allowFallback
    assert spec.spec.placement.pool == "any" and spec.spec.retryPolicy.maxTaskAttempts == 1


def test_a_workdir_that_is_no_unpacked_input_is_refused_by_the_recipe() -> None:
    problems = CommandRecipe().validate_params({"command": ["python"], "inputs": {"source": "artifact://s.tgz"},
                                               "workdir": "source"})
    assert problems == [("parameters.workdir is 'source'; it must name an input listed in parameters.unpack_inputs "
                         "(an archive the worker unpacks; listed: []), e.g. 'source'")]


def test_the_worker_runs_the_command_in_the_unpacked_workdir(tmp_path: Path) -> None:
    dirs = LeaseDirs(root=tmp_path / "lease", ckpt=tmp_path / "ckpt")
    assert task_cwd({"argv": ["x"]}, dirs) == dirs.root
    payload = {"inputs": {"source": "artifact://s.tgz"}, "unpack_inputs": ["source"], "workdir": "source"}
    assert task_cwd(payload, dirs) == dirs.inputs / "source"
    for bad in ({**payload, "unpack_inputs": []}, {**payload, "workdir": "../x"}, {**payload, "workdir": 3}):
        with pytest.raises(TaskRefused, match=r"payload workdir .* must name an input listed in unpack_inputs"):
            task_cwd(bad, dirs)


def test_whoami_says_who_the_coordinator_takes_the_caller_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from flashruntime.coordinator.app import create_app
    from tests.service_server import settings_for

    with TestClient(create_app(settings_for(tmp_path / "open"))) as api:
        assert api.get("/v1alpha1/whoami").json() == {"role": None, "name": None, "may_run_code": True,
                                                       "artifact_prefix": None}
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-a,bob:tok-b")
    monkeypatch.setenv("FLASHML_ARGV_SUBMITTERS", "alice")
    with TestClient(create_app(settings_for(tmp_path / "tokens"))) as api:
        assert api.get("/v1alpha1/whoami", headers={"Authorization": "Bearer tok-a"}).json() == {
            "role": "submitter", "name": "alice", "may_run_code": True, "artifact_prefix": "users/alice/"}
        assert api.get("/v1alpha1/whoami", headers={"Authorization": "Bearer tok-b"}).json()["may_run_code"] is False
        assert api.get("/v1alpha1/whoami").status_code == 401
