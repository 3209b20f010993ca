"""``expand_tasks``: the built-in expansions, recipe precedence, refusals
as ``ExpansionError``, the FedAvg key contract with the worker, and that the payload
keys expansion stamps are the ones the placement gates read."""

from __future__ import annotations

from typing import Any

import pytest

import flashruntime.leases
from flashml_workloads import fedavg_worker
from flashruntime import errors
from flashruntime.coordinator import expansion as modea
from flashruntime.coordinator.expansion import (
    ALLOWED_TASK_MODULES,
    FEDAVG_DRIVER_SUPPLIED_KEYS,
    FEDAVG_WORKER_PARAM_KEYS,
    MAX_LEASE_SECONDS,
    ExpansionError,
    expand_tasks,
)
from flashruntime.leases import LeaseManager
from flashruntime.protocol import v1alpha1 as p
from flashruntime.protocol.v1alpha1 import JobSpec, NodeCapabilities, TaskSpec
from flashruntime.recipes import WorkloadRecipe, base, register_recipe
from flashruntime.scheduler import IsolationAwarePlacement
from tests._support import run_core_only

MODULE_KEYS = {"module", "params", "inputs", "output_prefix", "task_id", "image", "isolation"}
WORKER = {"local_steps": 5, "lr": 0.05, "batch_size": 16, "seed": 7, "in_dim": 4, "hidden": 8, "out_dim": 3,
          "dataset_size": 256}
CENTROIDS = [[0.0, 0.0], [1.0, 1.0]]


def job(
    kind: str,
    params: dict[str, Any],
    *,
    pool: str = "any",
    tier: str = "standard",
    fallback: bool = False,
    gpus: int = 0,
    attempts: int = 4,
) -> JobSpec:
    return JobSpec.model_validate({
        "metadata": {"name": "exp"},
        "spec": {
            "execution": {"backend": "leases"},
            "image": {"repository": "local/tier1", "tag": "dev"},
            "workload": {"type": kind, "parameters": params},
            "resources": {"gpuPerTask": gpus},
            "placement": {"pool": pool},
            "isolation": {"tier": tier, "allowFallback": fallback},
            "retryPolicy": {"maxTaskAttempts": attempts},
        },
    })


def expand(kind: str, params: dict[str, Any], **kw: Any) -> list[TaskSpec]:
    return expand_tasks("j-1", job(kind, params, **kw))


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", raising=False)
    monkeypatch.setattr(base, "_RECIPES", dict(base._RECIPES))


def check_common(tasks: list[TaskSpec], attempts: int = 4) -> None:
    for task in tasks:
        assert task.job_id == "j-1"
        assert task.payload["task_id"] == task.task_id
        assert task.payload["output_prefix"] == f"jobs/j-1/{task.task_id}/"
        assert task.commit_key == f"jobs/j-1/{task.task_id}/metrics.json"
        assert task.max_attempts == attempts and task.max_expiries == 9
        assert task.payload["image"] == "local/tier1:dev"
        assert task.payload["isolation"] == {"tier": "standard", "allowFallback": False}


# --- exports -----------------------------------------------------------------------


def test_public_names_and_constants() -> None:
    assert ALLOWED_TASK_MODULES == frozenset({
        "flashml_workloads.sklearn_trial", "flashml_workloads.kmeans_shard",
        "flashml_workloads.sgd_trainer", "flashml_workloads.fedavg_worker",
    })
    assert isinstance(ALLOWED_TASK_MODULES, frozenset)
    assert MAX_LEASE_SECONDS is flashruntime.leases.MAX_LEASE_SECONDS
    assert ExpansionError is errors.ExpansionError and issubclass(ExpansionError, ValueError)
    assert modea.ClaimRequest is p.ClaimRequest
    assert modea.CompleteRequest is p.CompleteRequest and modea.FailRequest is p.FailRequest
    assert FEDAVG_WORKER_PARAM_KEYS == (
        "local_steps", "lr", "batch_size", "seed", "in_dim", "hidden", "out_dim", "dataset_size",
    )
    assert FEDAVG_DRIVER_SUPPLIED_KEYS == ("round", "shard", "num_shards")
    for name in modea.__all__:
        assert hasattr(modea, name)


def test_fedavg_key_tuples_cover_exactly_what_the_worker_reads() -> None:
    assert set(FEDAVG_WORKER_PARAM_KEYS) | set(FEDAVG_DRIVER_SUPPLIED_KEYS) == set(fedavg_worker.PARAM_KEYS)
    assert not set(FEDAVG_WORKER_PARAM_KEYS) & set(FEDAVG_DRIVER_SUPPLIED_KEYS)


def test_modea_imports_with_stdlib_and_pydantic_only_and_registers_command() -> None:
    code = (
        "import flashruntime.coordinator.expansion\n"
        "from flashruntime.recipes import recipe_for\n"
        "print(type(recipe_for('command')).__name__)\n"
    )
    proc = run_core_only(code, refuse=("fastapi", "uvicorn", "httpx", "torch", "numpy", "yaml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "CommandRecipe"


# --- hyperparameter_search -----------------------------------------------------------


def test_hyperparameter_search_trials() -> None:
    trials = [{"model": "logreg", "C": 0.1}, {"model": "rf", "n_estimators": 10}]
    tasks = expand("hyperparameter_search", {"trials": trials, "inputs": {"dataset": "artifact://d/iris.csv"}},
                   attempts=2)
    check_common(tasks, attempts=2)
    assert [t.task_id for t in tasks] == ["trial-000", "trial-001"]
    assert [t.payload["params"] for t in tasks] == trials
    assert tasks[0].payload["params"] is not trials[0]
    for task in tasks:
        assert set(task.payload) == MODULE_KEYS
        assert task.payload["module"] == "flashml_workloads.sklearn_trial"
        assert task.payload["inputs"] == {"dataset": "artifact://d/iris.csv"}
        assert task.lease_seconds == 60.0


def test_hyperparameter_search_grid_is_the_product_over_sorted_keys() -> None:
    tasks = expand("hyperparameter_search", {"grid": {"b": [1, 2], "a": ["x", "y", "z"]}})
    assert [t.payload["params"] for t in tasks] == [
        {"a": "x", "b": 1}, {"a": "x", "b": 2},
        {"a": "y", "b": 1}, {"a": "y", "b": 2},
        {"a": "z", "b": 1}, {"a": "z", "b": 2},
    ]
    assert [t.task_id for t in tasks] == [f"trial-{i:03d}" for i in range(6)]


@pytest.mark.parametrize(
    ("module", "stored"),
    [
        ("sgd_trainer", "flashml_workloads.sgd_trainer"),
        ("flashml_workloads.kmeans_shard", "flashml_workloads.kmeans_shard"),
        (None, "flashml_workloads.sklearn_trial"),
    ],
)
def test_hyperparameter_search_module_bare_or_qualified_is_stored_qualified(module: Any, stored: str) -> None:
    params: dict[str, Any] = {"trials": [{}]}
    if module is not None:
        params["module"] = module
    [task] = expand("hyperparameter_search", params)
    assert task.payload["module"] == stored


@pytest.mark.parametrize("module", ["os", "flashml_workloads.fedavg_driver", "evil.sklearn_trial", "", 3,
                                    "flashml_workloads.sklearn_trial.x"])
def test_hyperparameter_search_refuses_modules_off_the_allowlist(module: Any) -> None:
    refusal = r"hyperparameter_search: .*(allowlisted|name a task module).*sklearn_trial"
    with pytest.raises(ExpansionError, match=refusal):
        expand("hyperparameter_search", {"trials": [{}], "module": module})


def test_hyperparameter_search_forwards_checkpoint_and_stamps_pool() -> None:
    [task] = expand("hyperparameter_search", {"trials": [{}], "checkpoint": {"every": 10}}, pool="team-7")
    assert set(task.payload) == MODULE_KEYS | {"checkpoint", "pool"}
    assert task.payload["checkpoint"] == {"every": 10} and task.payload["pool"] == "team-7"


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({}, "exactly one of parameters.trials"),
        ({"trials": [{}], "grid": {"a": [1]}}, "both were given"),
        ({"trials": []}, "non-empty list of dicts"),
        ({"trials": [{}, 3]}, r"entries \[1\] are not dicts"),
        ({"grid": {}}, "non-empty dict"),
        ({"grid": {"a": []}}, r"\['a'\] must be non-empty lists"),
        ({"grid": {"a": 1}}, r"\['a'\] must be non-empty lists"),
        ({"grid": {f"k{i}": list(range(10)) for i in range(5)}}, "grid .* makes 100000 tasks, more than the 10000"),
        ({"trials": [{}], "inputs": {"d": "/data/x.csv"}}, "artifact://"),
        ({"trials": [{}], "inputs": {"../d": "artifact://x"}}, "plain file name"),
    ],
)
def test_hyperparameter_search_refusals(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ExpansionError, match=fragment):
        expand("hyperparameter_search", params)


# --- sharded_kmeans ----------------------------------------------------------------------


def test_sharded_kmeans() -> None:
    shards = ["artifact://km/shard-000.csv", "artifact://km/shard-001.csv", "artifact://km/shard-002.csv"]
    tasks = expand("sharded_kmeans", {"shards": shards, "centroids": CENTROIDS, "iteration": 3})
    check_common(tasks)
    assert [t.task_id for t in tasks] == ["it03-shard-000", "it03-shard-001", "it03-shard-002"]
    for task, uri in zip(tasks, shards, strict=True):
        assert set(task.payload) == MODULE_KEYS
        assert task.payload["module"] == "flashml_workloads.kmeans_shard"
        assert task.payload["params"] == {"centroids": CENTROIDS}
        assert task.payload["inputs"] == {"shard": uri}
        assert task.lease_seconds == 60.0


def test_sharded_kmeans_iteration_defaults_to_zero() -> None:
    [task] = expand("sharded_kmeans", {"shards": ["artifact://s"], "centroids": CENTROIDS})
    assert task.task_id == "it00-shard-000"


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"centroids": CENTROIDS}, "shards is None"),
        ({"shards": [], "centroids": CENTROIDS}, "non-empty list of artifact://"),
        ({"shards": ["artifact://a", "/tmp/b"], "centroids": CENTROIDS}, r"entries \[1\] are not artifact://"),
        ({"shards": ["artifact://a"]}, "centroids is None; it is required"),
        ({"shards": ["artifact://a"], "centroids": CENTROIDS, "iteration": -1}, "iteration is -1"),
        ({"shards": ["artifact://a"], "centroids": CENTROIDS, "iteration": True}, "iteration is True"),
    ],
)
def test_sharded_kmeans_refusals(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ExpansionError, match=rf"sharded_kmeans: .*{fragment}"):
        expand("sharded_kmeans", params)


# --- federated_averaging -----------------------------------------------------------------


def test_federated_averaging() -> None:
    tasks = expand("federated_averaging",
                   {**WORKER, "num_shards": 3, "round": 2, "weights": "artifact://fl/round-002/global.bin"})
    check_common(tasks)
    assert [t.task_id for t in tasks] == ["shard-000", "shard-001", "shard-002"]
    for i, task in enumerate(tasks):
        assert set(task.payload) == MODULE_KEYS
        assert task.payload["module"] == "flashml_workloads.fedavg_worker"
        assert task.payload["params"] == {**WORKER, "round": 2, "shard": i, "num_shards": 3}
        assert set(task.payload["params"]) == set(fedavg_worker.PARAM_KEYS)
        assert task.payload["inputs"] == {"weights": "artifact://fl/round-002/global.bin"}
        assert task.lease_seconds == 120.0


def test_federated_averaging_round_zero_without_weights() -> None:
    [task] = expand("federated_averaging", {**WORKER, "num_shards": 1})
    assert task.payload["inputs"] == {}
    assert task.payload["params"]["round"] == 0


def test_federated_averaging_num_shards_upper_bound() -> None:
    tasks = expand("federated_averaging", {**WORKER, "num_shards": 999})
    assert len(tasks) == 999 and tasks[-1].task_id == "shard-998"


@pytest.mark.parametrize("num_shards", [0, 1000, -1, True, "3", 2.0, None])
def test_federated_averaging_num_shards_out_of_range(num_shards: Any) -> None:
    params = {**WORKER}
    if num_shards is not None:
        params["num_shards"] = num_shards
    with pytest.raises(ExpansionError, match=r"num_shards is .*integer from 1 to 999"):
        expand("federated_averaging", params)


def test_federated_averaging_lists_missing_worker_keys() -> None:
    params = {key: value for key, value in WORKER.items() if key not in ("lr", "hidden")}
    with pytest.raises(ExpansionError, match=r"missing worker parameters \['lr', 'hidden'\]"):
        expand("federated_averaging", {**params, "num_shards": 2})


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [({"weights": "/tmp/w.bin"}, "weights is '/tmp/w.bin'"), ({"round": -1}, "round is -1")],
)
def test_federated_averaging_refusals(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ExpansionError, match=fragment):
        expand("federated_averaging", {**WORKER, "num_shards": 2, **extra})


# --- lease seconds for built-ins ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("hyperparameter_search", {"trials": [{}]}),
        ("sharded_kmeans", {"shards": ["artifact://s"], "centroids": CENTROIDS}),
        ("federated_averaging", {**WORKER, "num_shards": 1}),
    ],
)
def test_builtin_lease_seconds_bounded_and_refused(kind: str, params: dict[str, Any]) -> None:
    [task] = expand(kind, {**params, "lease_seconds": "15"})
    assert task.lease_seconds == 15.0
    [task] = expand(kind, {**params, "lease_seconds": 10**9})
    assert task.lease_seconds == float(MAX_LEASE_SECONDS)
    for bad in (0, -1, "x", False, float("nan")):
        with pytest.raises(ExpansionError, match=rf"{kind}: parameters\.lease_seconds"):
            expand(kind, {**params, "lease_seconds": bad})


# --- recipes, command, unknown types ---------------------------------------------------------


class Shadow(WorkloadRecipe):
    kind = "sharded_kmeans"
    task_module = "flashml_workloads.kmeans_shard"

    def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
        if spec.spec.workload.parameters.get("refuse"):
            raise ValueError("shadow refuses: set refuse to false")
        return [TaskSpec(task_id="shadow-000", job_id=job_id, commit_key=f"jobs/{job_id}/shadow-000/metrics.json")]

    def validate_output(self, metrics: Any) -> None:
        return None


def test_a_registered_recipe_wins_over_the_builtin() -> None:
    register_recipe(Shadow())
    [task] = expand("sharded_kmeans", {})
    assert task.task_id == "shadow-000"


def test_a_recipe_value_error_becomes_an_expansion_error_with_the_same_message() -> None:
    register_recipe(Shadow())
    with pytest.raises(ExpansionError) as caught:
        expand("sharded_kmeans", {"refuse": True})
    assert str(caught.value) == "shadow refuses: set refuse to false"
    assert isinstance(caught.value.__cause__, ValueError)


def test_command_jobs_expand_through_the_registered_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ExpansionError, match="FLASHML_ALLOW_UNSANDBOXED_ARGV"):
        expand("command", {"command": ["run"]})
    with pytest.raises(ExpansionError, match="allowFallback"):
        expand("command", {"command": ["run"]}, fallback=True)
    monkeypatch.setenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", "1")
    [task] = expand("command", {"command": ["run"]}, attempts=6)
    check_common([task], attempts=6)
    assert task.payload["argv"] == ["run"]


def test_unknown_type_lists_what_is_supported() -> None:
    with pytest.raises(ExpansionError) as caught:
        expand("map_reduce", {})
    message = str(caught.value)
    for kind in ("map_reduce", "federated_averaging", "hyperparameter_search", "sharded_kmeans", "command"):
        assert repr(kind) in message
    assert "register_recipe" in message


# --- the stamped keys are the ones the placement gates read ---------------------------------------


def node_view(*, pools: list[str], datasets: list[str], gpus: int, unsandboxed: bool = True,
              module_capable: bool = True) -> dict[str, Any]:
    """The claim node view, built from the wire models."""
    return {
        "node_id": "n1",
        "sandbox_capable": False,
        "argv_capable": False,
        "unsandboxed_argv_capable": unsandboxed,
        "module_capable": module_capable,
        "local_datasets": datasets,
        "capabilities": NodeCapabilities(gpus=[{"index": i} for i in range(gpus)], pools=pools).model_dump(),
    }


def test_expanded_command_tasks_meet_the_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", "1")
    [task] = expand("command", {"command": ["run"], "local_inputs": ["imagenet"]},
                    pool="team-7", fallback=True, gpus=2)
    policy = IsolationAwarePlacement()
    matching = node_view(pools=["team-7"], datasets=["imagenet"], gpus=2)
    assert policy.eligible(task, matching) is True
    # Each view differs from the matching one in exactly what one stamped key asks for.
    assert policy.eligible(task, node_view(pools=["team-8"], datasets=["imagenet"], gpus=2)) is False  # pool
    assert policy.eligible(task, node_view(pools=["team-7"], datasets=[], gpus=2)) is False  # local_inputs
    assert policy.eligible(task, node_view(pools=["team-7"], datasets=["imagenet"], gpus=1)) is False  # gpus
    assert policy.eligible(task, node_view(pools=["team-7"], datasets=["imagenet"], gpus=2,
                                           unsandboxed=False)) is False  # argv + pool + isolation waiver

    manager = LeaseManager()
    manager.add_task(task)
    assert manager.claim("n1", policy=policy, node=node_view(pools=[], datasets=["imagenet"], gpus=2)) is None
    lease = manager.claim("n1", policy=policy, node=matching)
    assert lease is not None and lease.task_id == task.task_id and lease.payload == task.payload


def test_expanded_module_tasks_meet_the_gates() -> None:
    [task] = expand("sharded_kmeans", {"shards": ["artifact://s"], "centroids": CENTROIDS}, pool="team-7")
    policy = IsolationAwarePlacement()
    assert policy.eligible(task, node_view(pools=["team-7"], datasets=[], gpus=0)) is True
    assert policy.eligible(task, node_view(pools=[], datasets=[], gpus=0)) is False  # pool
    assert policy.eligible(task, node_view(pools=["team-7"], datasets=[], gpus=0, module_capable=False)) is False
    [anywhere] = expand("sharded_kmeans", {"shards": ["artifact://s"], "centroids": CENTROIDS})
    assert policy.eligible(anywhere, node_view(pools=[], datasets=[], gpus=0)) is True
