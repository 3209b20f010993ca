"""``flash.run`` argument handling and its pure builders: one of workload /
command, the plan's checkpoint, the torchrun wrapping of coordinated plans, the
coordinator URL and the JobSpec of independent_tasks plans."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import pytest

import flashruntime as flash
from flashruntime.local.flash_run import (
    coordinated_workload,
    independent_jobspec,
    plan_workload,
    resolve_coordinator_url,
)
from flashruntime.protocol.plan_v1alpha1 import CheckpointPolicy, StrategyPlan
from flashruntime.protocol.v1alpha1 import ImageSpec, IsolationSpec
from flashruntime.workloads.command import CommandWorkload, Source

DCP = CheckpointPolicy(backend="pytorch_dcp", interval_seconds=300, note="from the plan")


def make_plan(mode: str = "coordinated_training", **fields: Any) -> StrategyPlan:
    values: dict[str, Any] = {"plan_id": "pl_0123456789abcdef", "planner_version": "0.1.0", "workload_mode": mode,
                              "strategy_family": "ddp", "launcher": "torchrun", "workers": 4}
    values.update(fields)
    return StrategyPlan(**values)


# --- exactly one of workload / command ----------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"workload": CommandWorkload(command="python t.py"), "command": "python t.py"}])
def test_exactly_one_of_workload_and_command(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exactly one of workload=CommandWorkload"):
        flash.run(make_plan("local"), **kwargs)


def test_command_becomes_a_command_workload() -> None:
    built = plan_workload(make_plan("local"), command=["python", "t.py", "--lr", "0.1"])
    assert isinstance(built, CommandWorkload) and built.argv() == ["python", "t.py", "--lr", "0.1"]


def test_no_plan_points_at_the_planners_hint() -> None:
    with pytest.raises(ValueError, match="no_valid_strategy_hint"):
        flash.run(None, command="python t.py")  # type: ignore[arg-type]


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="takes a StrategyPlan"):
        flash.run({"workload_mode": "local"}, command="python t.py")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="workload must be a CommandWorkload, got str"):
        flash.run(make_plan("local"), workload="python t.py")  # type: ignore[arg-type]


def test_plan_checkpoint_fills_a_workload_without_one_and_leaves_the_callers_untouched() -> None:
    own = CommandWorkload(command="python t.py")
    filled = plan_workload(make_plan(checkpoint=DCP), workload=own)
    assert filled.checkpoint == DCP and filled.checkpoint is not DCP
    assert own.checkpoint is None


def test_plan_checkpoint_does_not_replace_the_workloads_own() -> None:
    mine = CheckpointPolicy(backend="local_manifest", interval_seconds=60)
    kept = plan_workload(make_plan(checkpoint=DCP), workload=CommandWorkload(command="python t.py", checkpoint=mine))
    assert kept.checkpoint == mine


def test_no_plan_checkpoint_leaves_none() -> None:
    assert plan_workload(make_plan(), command="python t.py").checkpoint is None


# --- coordinated_training ----------------------------------------------------------


TORCHRUN_HEAD = ["torchrun", "--nproc-per-node=4", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1"]


@pytest.mark.parametrize("interpreter", ["python", "python3", sys.executable])
def test_leading_interpreter_is_dropped_and_the_script_wrapped(interpreter: str) -> None:
    workload = CommandWorkload(command=[interpreter, "train.py", "--lr", "0.1", "a b"], env={"KEEP": "1"},
                               source=Source(path="/src"))
    wrapped = coordinated_workload(make_plan(), workload)
    assert wrapped.argv() == [*TORCHRUN_HEAD, "train.py", "--lr", "0.1", "a b"]
    assert wrapped.mode == "coordinated" and wrapped.resolved_mode() == "coordinated"
    assert wrapped.env == {"KEEP": "1", "FLASHML_PLAN_ID": "pl_0123456789abcdef", "FLASHML_STRATEGY_FAMILY": "ddp"}
    assert wrapped.source.path == "/src"
    assert workload.env == {"KEEP": "1"} and workload.argv()[0] == interpreter  # the caller's workload unchanged


def test_a_string_command_and_a_bare_script_are_wrapped_too() -> None:
    plan = make_plan(workers=2, strategy_family="fsdp2")
    assert coordinated_workload(plan, CommandWorkload(command="python -m pkg.train --x 'y z'")).argv() == [
        "torchrun", "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
        "-m", "pkg.train", "--x", "y z"]
    bare = coordinated_workload(plan, CommandWorkload(command=["train.py"], env={"FLASHML_PLAN_ID": "mine"}))
    assert bare.argv()[-1] == "train.py"
    assert bare.env == {"FLASHML_PLAN_ID": "pl_0123456789abcdef", "FLASHML_STRATEGY_FAMILY": "fsdp2"}


@pytest.mark.parametrize("command, tail, carried", [
    ("python -u train.py --x 1", ["train.py", "--x", "1"], {"PYTHONUNBUFFERED": "1"}),
    ("python3 -OO -uB train.py", ["train.py"],
     {"PYTHONOPTIMIZE": "2", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}),
    ("python -O -X dev -Xutf8=0 -W ignore::DeprecationWarning -Werror train.py -W x", ["train.py", "-W", "x"],
     {"PYTHONOPTIMIZE": "1", "PYTHONDEVMODE": "1", "PYTHONUTF8": "0",
      "PYTHONWARNINGS": "ignore::DeprecationWarning,error"}),
    ("python -u -m pkg.train --lr 1", ["-m", "pkg.train", "--lr", "1"], {"PYTHONUNBUFFERED": "1"}),
    ("python -q -- train.py", ["train.py"], {}),
])
def test_interpreter_options_are_carried_by_the_environment_not_given_to_torchrun(
    command: str, tail: list[str], carried: dict[str, str]
) -> None:
    wrapped = coordinated_workload(make_plan(), CommandWorkload(command=command, env={"KEEP": "1"}))
    assert wrapped.argv() == [*TORCHRUN_HEAD, *tail]
    assert wrapped.env == {"KEEP": "1", **carried, "FLASHML_PLAN_ID": "pl_0123456789abcdef",
                           "FLASHML_STRATEGY_FAMILY": "ddp"}


def test_warning_filters_follow_the_workloads_own() -> None:
    workload = CommandWorkload(command="python -W error t.py", env={"PYTHONWARNINGS": "ignore"})
    assert coordinated_workload(make_plan(), workload).env["PYTHONWARNINGS"] == "ignore,error"


@pytest.mark.parametrize("command, message", [
    ("python -c 'print(1)'", "runs code given with -c; torchrun launches a script or a module"),
    ("python -I train.py", "gives python the option -I, which cannot be carried to the ranks"),
    ("python -X nosuch train.py", "gives python the option -X nosuch, which cannot be carried"),
    ("python --version", "gives python the option --version"),
    ("python -W", "python's option -W needs a value"),
    ("python -u", "names no script"),
])
def test_interpreter_options_that_cannot_be_carried_are_refused(command: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        coordinated_workload(make_plan(), CommandWorkload(command=command))


def test_nproc_per_node_is_the_plans_workers() -> None:
    for workers in (1, 3, 8):
        argv = coordinated_workload(make_plan(workers=workers), CommandWorkload(command="python t.py")).argv()
        assert argv[1] == f"--nproc-per-node={workers}"
        assert shlex.join(argv).endswith(" t.py")


def test_multi_host_plan_points_at_multi_node_ddp() -> None:
    with pytest.raises(ValueError, match=r"integrations\.pytorch\.ddp\(.*nnodes=\.\.\., rdzv_endpoint='host:port'\)"):
        coordinated_workload(make_plan(colocated=False), CommandWorkload(command="python t.py"))
    with pytest.raises(ValueError, match="colocated=False"):
        flash.run(make_plan(colocated=False), command="python t.py", watch=False)


def test_coordinated_refusals_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="already starts torchrun; give the bare script"):
        coordinated_workload(make_plan(), CommandWorkload(command="torchrun --nproc-per-node=2 t.py"))
    with pytest.raises(ValueError, match="names no script"):
        coordinated_workload(make_plan(), CommandWorkload(command=["python"]))
    with pytest.raises(ValueError, match="workers=0; a coordinated plan needs workers >= 1"):
        coordinated_workload(make_plan(workers=0), CommandWorkload(command="python t.py"))


# --- independent_tasks: coordinator URL ------------------------------------------------


def test_url_argument_wins_over_the_environment() -> None:
    env = {"FLASHML_RUNTIME_API": "http://env:8000"}
    assert resolve_coordinator_url("http://arg:9000/", env) == "http://arg:9000"
    assert resolve_coordinator_url(None, env) == "http://env:8000"


@pytest.mark.parametrize("env", [{}, {"FLASHML_RUNTIME_API": ""}])
def test_no_url_anywhere_is_a_value_error(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="pass coordinator_url='http://host:8000' or set FLASHML_RUNTIME_API"):
        resolve_coordinator_url(None, env)


def test_non_http_url_is_refused() -> None:
    with pytest.raises(ValueError, match="must be an http"):
        resolve_coordinator_url("127.0.0.1:8000", {})


def test_run_refuses_an_independent_tasks_plan_without_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_RUNTIME_API", raising=False)
    plan = make_plan("independent_tasks", strategy_family="lease_tasks")
    with pytest.raises(ValueError, match="FLASHML_RUNTIME_API"):
        flash.run(plan, command="python t.py", image="acme/t:1")


# --- independent_tasks: JobSpec ---------------------------------------------------------


def test_jobspec_mapping() -> None:
    plan = make_plan("independent_tasks", strategy_family="lease_tasks", workers=6, gpus_per_worker=2,
                     checkpoint=DCP)
    workload = plan_workload(plan, workload=CommandWorkload(
        command=["python", "t.py", "--lr", "{lr}"], task_params=[{"lr": 0.1}, {"lr": 0.01}], env={"A": "1"},
        isolation=IsolationSpec(tier="sandboxed"), inputs={"data": "artifact://datasets/x.csv"}))
    spec = independent_jobspec(plan, workload, image="ghcr.io/acme/train:1.2")
    assert spec.metadata.name == "plan-0123456789abcdef"
    inner = spec.spec
    assert inner.execution.backend == "leases"
    assert (inner.image.repository, inner.image.tag) == ("ghcr.io/acme/train", "1.2")
    assert (inner.resources.gpuPerTask, inner.resources.minimumWorkers, inner.resources.maximumWorkers) == (2, 1, 6)
    assert (inner.resources.cpuPerTask, inner.resources.memoryPerTask) == (1, "512Mi")
    assert inner.isolation.tier == "sandboxed"
    assert inner.workload.type == "command"
    assert inner.workload.parameters == {
        "command": ["python", "t.py", "--lr", "{lr}"], "env": {"A": "1"},
        "inputs": {"data": "artifact://datasets/x.csv"}, "task_params": [{"lr": 0.1}, {"lr": 0.01}],
        "checkpoint": DCP.model_dump()}


def test_jobspec_name_image_and_worker_floor() -> None:
    plan = make_plan("independent_tasks", workers=0, gpus_per_worker=0)
    workload = CommandWorkload(command="python t.py", image=ImageSpec(repository="acme/own", tag="3"))
    spec = independent_jobspec(plan, workload, name="my-sweep")
    assert spec.metadata.name == "my-sweep"
    assert spec.spec.image.reference == "acme/own:3"  # the workload's image when none is passed
    assert (spec.spec.resources.minimumWorkers, spec.spec.resources.maximumWorkers) == (1, 1)
    passed = independent_jobspec(plan, workload, image=ImageSpec(repository="acme/arg", tag="4"))
    assert passed.spec.image.reference == "acme/arg:4"
    assert independent_jobspec(plan, workload, image="localhost:5000/acme/t:7").spec.image.reference == (
        "localhost:5000/acme/t:7")


@pytest.mark.parametrize("image", ["acme/train", "localhost:5000/acme/train", "acme/t@sha256:abc", ":1"])
def test_image_strings_need_repository_and_tag(image: str) -> None:
    with pytest.raises(ValueError, match="is not 'repository:tag'"):
        independent_jobspec(make_plan("independent_tasks"), CommandWorkload(command="python t.py"), image=image)


def test_without_an_image_the_job_carries_none() -> None:
    spec = independent_jobspec(make_plan("independent_tasks"), CommandWorkload(command="python t.py"))
    assert spec.spec.image is None


def test_a_planner_plan_maps_to_a_jobspec() -> None:
    report = flash.plan(flash.PlanRequest(
        workload=flash.IndependentTasks(task_count=8, needs_gpu=True, vram_gb_per_task=4),
        resources=flash.Resources(gpus=4, gpu_type="l4")))
    plan = report.selected
    assert plan is not None and plan.workload_mode == "independent_tasks"
    spec = independent_jobspec(plan, plan_workload(plan, command="python t.py --i {i}"), image="acme/t:1")
    assert spec.metadata.name == "plan-" + plan.plan_id.removeprefix("pl_")
    resources = spec.spec.resources
    assert (resources.gpuPerTask, resources.minimumWorkers, resources.maximumWorkers) == (
        plan.gpus_per_worker, 1, plan.workers)
