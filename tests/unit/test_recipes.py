"""Workload recipes: the ``WorkloadRecipe`` defaults, the registry, and
``CommandRecipe``'s four expansion steps in order, placeholder formatting, and the
payload keys it stamps (present or absent exactly as documented)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flashruntime.leases import MAX_LEASE_SECONDS
from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec
from flashruntime.recipes import WorkloadRecipe, base, recipe_for, register_recipe
from flashruntime.recipes.command import CommandRecipe
from tests._support import run_core_only

OPT_IN = "FLASHML_ALLOW_UNSANDBOXED_ARGV"
ALWAYS = {"argv", "env", "inputs", "output_prefix", "task_id", "image", "isolation"}
RECIPE = CommandRecipe()


def job(
    params: dict[str, Any],
    *,
    pool: str = "any",
    tier: str = "sandboxed",
    fallback: bool = False,
    gpus: int = 0,
    attempts: int = 4,
) -> JobSpec:
    return JobSpec.model_validate({
        "metadata": {"name": "cmd"},
        "spec": {
            "execution": {"backend": "leases"},
            "image": {"repository": "ghcr.io/acme/train", "tag": "1.2"},
            "workload": {"type": "command", "parameters": params},
            "resources": {"gpuPerTask": gpus},
            "placement": {"pool": pool},
            "isolation": {"tier": tier, "allowFallback": fallback},
            "retryPolicy": {"maxTaskAttempts": attempts},
        },
    })


def expand(params: dict[str, Any], **kw: Any) -> list[TaskSpec]:
    return RECIPE.expand("job-1", job(params, **kw))


@pytest.fixture(autouse=True)
def _clean_env_and_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPT_IN, raising=False)
    # Tests register throwaway recipes; give each test its own copy of the registry.
    monkeypatch.setattr(base, "_RECIPES", dict(base._RECIPES))


class Minimal(WorkloadRecipe):
    kind = "minimal"

    def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
        return [TaskSpec(task_id="t-000", job_id=job_id, commit_key=f"jobs/{job_id}/t-000/metrics.json")]

    def validate_output(self, metrics: Any) -> None:
        if "loss" not in metrics:
            raise ValueError("metrics.json needs 'loss'")


# --- WorkloadRecipe ----------------------------------------------------------------


def test_workload_recipe_is_abstract_in_expand_and_validate_output() -> None:
    with pytest.raises(TypeError):
        WorkloadRecipe()  # type: ignore[abstract]

    class OnlyExpand(WorkloadRecipe):
        def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
            return []

    with pytest.raises(TypeError, match="validate_output"):
        OnlyExpand()  # type: ignore[abstract]


def test_workload_recipe_defaults() -> None:
    recipe = Minimal()
    assert WorkloadRecipe.kind == "" and WorkloadRecipe.task_module == ""
    assert Minimal.task_module == ""
    assert recipe.validate_params({"anything": 1}) == []
    assert recipe.reduce({"t-000": {"loss": 0.1}}) is None
    assert recipe.checkpointable() is False
    hints = recipe.plan_hints()
    assert hints == {}
    hints["x"] = 1
    assert recipe.plan_hints() == {}  # a fresh dict each call


# --- registry ------------------------------------------------------------------------


def test_register_and_look_up_by_kind() -> None:
    recipe = Minimal()
    register_recipe(recipe)
    assert recipe_for("minimal") is recipe


def test_register_replaces_a_recipe_of_the_same_kind() -> None:
    first, second = Minimal(), Minimal()
    register_recipe(first)
    register_recipe(second)
    assert recipe_for("minimal") is second
    assert recipe_for("command") is not second  # other kinds untouched


def test_recipe_for_unknown_kind_lists_registered_kinds() -> None:
    register_recipe(Minimal())
    with pytest.raises(LookupError, match=r"'nope'.*registered: 'command', 'minimal'.*register_recipe"):
        recipe_for("nope")


def test_register_refuses_classes_non_recipes_and_empty_kinds() -> None:
    with pytest.raises(TypeError, match=r"register_recipe\(Minimal\(\)\)"):
        register_recipe(Minimal)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="WorkloadRecipe"):
        register_recipe(object())  # type: ignore[arg-type]

    class NoKind(Minimal):
        kind = ""

    with pytest.raises(ValueError, match="kind"):
        register_recipe(NoKind())


def test_command_recipe_is_registered_on_import_of_its_module_only() -> None:
    assert isinstance(recipe_for("command"), CommandRecipe)
    assert CommandRecipe.kind == "command" and CommandRecipe.task_module == ""
    code = (
        "from flashruntime.recipes import recipe_for\n"
        "try:\n    recipe_for('command')\nexcept LookupError:\n    print('absent')\n"
        "import flashruntime.recipes.command\n"
        "print(type(recipe_for('command')).__name__)\n"
        "import sys\n"
        "heavy = {'torch', 'numpy', 'fastapi', 'uvicorn', 'httpx', 'yaml'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    proc = run_core_only(code, refuse=("torch", "numpy", "fastapi"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["absent", "CommandRecipe", "[]"]


# --- CommandRecipe step 1: pool + allowFallback -------------------------------------------


def test_step1_waiver_outside_a_team_pool_is_refused_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "1")
    for tier in ("sandboxed", "standard"):
        with pytest.raises(ValueError, match=r"allowFallback.*pool is 'any'.*team pool"):
            expand({"command": []}, fallback=True, tier=tier)  # bad params too: step 1 wins


def test_step1_waiver_inside_a_team_pool_passes() -> None:
    [task] = expand({"command": ["run"]}, fallback=True, pool="team-7")
    assert task.payload["pool"] == "team-7"
    assert task.payload["isolation"] == {"tier": "sandboxed", "allowFallback": True}


# --- step 2: unsandboxed argv needs the coordinator's opt-in --------------------------------


def test_step2_standard_tier_is_refused_without_the_opt_in_before_params() -> None:
    with pytest.raises(ValueError, match=rf"tier 'sandboxed'.*{OPT_IN}=1"):
        expand({"command": []}, tier="standard")  # bad params too: step 2 comes first


@pytest.mark.parametrize("value", ["0", "true", "yes", " 1", ""])
def test_step2_only_the_exact_value_1_opts_in(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(OPT_IN, value)
    with pytest.raises(ValueError, match=OPT_IN):
        expand({"command": ["run"]}, tier="standard")


def test_step2_opt_in_is_read_at_expansion_time(monkeypatch: pytest.MonkeyPatch) -> None:
    params = {"command": ["run"]}
    with pytest.raises(ValueError, match=OPT_IN):
        expand(params, tier="standard")
    monkeypatch.setenv(OPT_IN, "1")
    [task] = expand(params, tier="standard")  # same recipe instance, new answer
    assert task.payload["isolation"] == {"tier": "standard", "allowFallback": False}
    monkeypatch.delenv(OPT_IN)
    with pytest.raises(ValueError, match=OPT_IN):
        expand(params, tier="standard")


def test_pool_job_with_waiver_accepted_when_sandboxed_or_standard_with_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(expand({"command": ["run"]}, pool="team-7", fallback=True, tier="sandboxed")) == 1
    with pytest.raises(ValueError, match=OPT_IN):
        expand({"command": ["run"]}, pool="team-7", fallback=True, tier="standard")
    monkeypatch.setenv(OPT_IN, "1")
    assert len(expand({"command": ["run"]}, pool="team-7", fallback=True, tier="standard")) == 1


# --- step 3: parameter shapes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({}, "parameters.command is None"),
        ({"command": []}, "non-empty list of strings"),
        ({"command": "python t.py"}, "non-empty list of strings"),
        ({"command": ["python", 3]}, "non-empty list of strings"),
        ({"command": ["run"], "inputs": {"data": "/etc/passwd"}}, r"inputs\['data'\].*artifact://"),
        ({"command": ["run"], "inputs": {"data": "artifact://"}}, "artifact://"),
        ({"command": ["run"], "inputs": ["artifact://x"]}, "parameters.inputs must be a mapping"),
        ({"command": ["run"], "inputs": {"../x": "artifact://x"}}, "plain file name"),
        ({"command": ["run"], "task_params": {"lr": 1}}, "task_params must be a list of dicts"),
        ({"command": ["run"], "task_params": [{"lr": 1}, 5]}, r"task_params\[1\] is 5"),
        ({"command": ["run"], "unpack_inputs": "data"}, "unpack_inputs is 'data'"),
        ({"command": ["run"], "unpack_inputs": [1]}, "list of input names"),
        (
            {"command": ["run"], "inputs": {"data": "artifact://d.tar"}, "unpack_inputs": ["data", "data"]},
            r"names \['data'\] more than once",
        ),
        ({"command": ["run"], "unpack_inputs": ["data"]}, r"\['data'\], which are not declared"),
        ({"command": ["run"], "env": {"A": 1}}, r"env\['A'\] is 1"),
        ({"command": ["run"], "env": ["A=1"]}, "env must be a mapping"),
    ],
)
def test_step3_each_param_rule_refuses(params: dict[str, Any], fragment: str) -> None:
    assert RECIPE.validate_params(params)
    with pytest.raises(ValueError, match=fragment):
        expand(params)


def test_step3_problems_are_joined_with_semicolons() -> None:
    params = {"command": [], "inputs": {"d": "s3://x"}, "task_params": [1]}
    problems = RECIPE.validate_params(params)
    assert len(problems) == 3
    with pytest.raises(ValueError) as caught:
        expand(params)
    assert str(caught.value) == "; ".join(problems)


def test_step3_runs_before_placeholders_are_filled() -> None:
    # task_params[1] is not a dict (step 3) and "{missing}" has no value (step 4): step 3 reports.
    with pytest.raises(ValueError, match=r"task_params\[1\]"):
        expand({"command": ["{missing}"], "task_params": [{}, "x"]})


def test_valid_params_have_no_problems_and_none_means_not_set() -> None:
    params = {
        "command": ["python", "t.py"], "env": {"A": "1"}, "inputs": {"data": "artifact://d.tar"},
        "task_params": [{"lr": 1}], "unpack_inputs": ["data"],
    }
    assert RECIPE.validate_params(params) == []
    assert RECIPE.validate_params({"command": ["x"], "env": None, "inputs": None, "task_params": None,
                                   "unpack_inputs": None}) == []


# --- step 4: one task per parameter set, placeholders filled ------------------------------------


def test_step4_argv_and_env_are_formatted_per_task() -> None:
    tasks = expand({
        "command": ["python", "t.py", "--lr", "{lr}", "--tag={name}-{lr}"],
        "env": {"LR": "{lr}", "FIXED": "x"},
        "task_params": [{"lr": 0.1, "name": "a"}, {"lr": 0.01, "name": "b"}],
    })
    assert [t.task_id for t in tasks] == ["task-000", "task-001"]
    assert tasks[0].payload["argv"] == ["python", "t.py", "--lr", "0.1", "--tag=a-0.1"]
    assert tasks[1].payload["argv"] == ["python", "t.py", "--lr", "0.01", "--tag=b-0.01"]
    assert tasks[0].payload["env"] == {"LR": "0.1", "FIXED": "x"}
    assert tasks[1].payload["env"] == {"LR": "0.01", "FIXED": "x"}
    assert [t.payload["task_id"] for t in tasks] == ["task-000", "task-001"]


def test_step4_ids_are_zero_padded_and_deterministic() -> None:
    params = {"command": ["run", "{i}"], "task_params": [{"i": i} for i in range(12)]}
    tasks = expand(params)
    assert [t.task_id for t in tasks][-3:] == ["task-009", "task-010", "task-011"]
    assert [t.model_dump() for t in expand(params)] == [t.model_dump() for t in tasks]


@pytest.mark.parametrize("task_params", [None, []])
def test_step4_without_task_params_one_task_with_tokens_verbatim(task_params: Any) -> None:
    params: dict[str, Any] = {"command": ["python", "-c", "print({'a': 1})"], "env": {"J": "{x}"}}
    if task_params is not None:
        params["task_params"] = task_params
    [task] = expand(params)
    assert task.task_id == "task-000"
    assert task.payload["argv"] == ["python", "-c", "print({'a': 1})"]
    assert task.payload["env"] == {"J": "{x}"}


@pytest.mark.parametrize(
    ("command", "env", "index", "where"),
    [
        (["run", "{lr}"], {}, 1, "argv token"),  # KeyError: task_params[1] has no lr
        (["run", "{xs[5]}"], {}, 0, "argv token"),  # IndexError: xs has one item
        (["run", "{lr"], {}, 0, "argv token"),  # ValueError: unbalanced brace
        (["run"], {"LR": "{lr}"}, 1, "env LR"),  # KeyError in an env value
    ],
)
def test_step4_unfillable_placeholder_names_the_task(
    command: list[str], env: dict[str, str], index: int, where: str
) -> None:
    params = {"command": command, "env": env, "task_params": [{"lr": 1, "xs": [1]}, {"xs": [1]}]}
    with pytest.raises(ValueError, match=rf"^task {index}: placeholder in {where}") as caught:
        expand(params)
    assert "'{{' and '}}'" in str(caught.value)  # says how to write literal braces


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("{x:>20000000}", "{x:>20000000} asks for a width or precision of 20000000"),
        ("{x:.1001f}", "{x:.1001f} asks for a width or precision of 1001"),
        ("{x.__class__.__mro__}", "{x.__class__.__mro__} reads an attribute"),
        ("{xs[0].real}", "{xs[0].real} reads an attribute"),
        ("{x:{y}}", "{x:{y}} takes part of its format spec from another field"),
    ],
)
def test_step4_placeholders_may_not_read_attributes_or_grow_without_bound(token: str, problem: str) -> None:
    """Any submitter can send a command job (open mode needs no token): attribute access renders
    the coordinator's objects, and a width from the spec (or from another field) could grow one
    token to any size."""
    params = {"command": ["run", f"a{token}b"], "task_params": [{"x": 1, "y": 2, "xs": [1]}]}
    with pytest.raises(ValueError, match=r"^task 0: placeholder in argv token .* is not allowed: ") as caught:
        expand(params)
    message = str(caught.value)
    assert f"is not allowed: {problem}; " in message
    assert "widths and precisions are at most 1000" in message and "'{{' and '}}'" in message
    with pytest.raises(ValueError, match=r"^task 0: placeholder in env E .* is not allowed"):
        expand({"command": ["run"], "env": {"E": token}, "task_params": [{"x": 1, "y": 2, "xs": [1]}]})


def test_step4_format_specs_conversions_and_indexing_fill_as_str_format_does() -> None:
    """What ``str.format`` offers a legitimate template still works: bounded specs, conversions,
    indexing into lists and dicts (an index key may hold a '.')."""
    values = {"lr": 0.00123, "i": 7, "name": "a b", "xs": [3, 4], "cfg": {"a.b": "deep"}}
    template = "{lr:.3g}|{i:05d}|{name!r}|{xs[1]}|{cfg[a.b]}|{i:0>1000}"
    [task] = expand({"command": [template], "task_params": [values]})
    assert task.payload["argv"] == [template.format_map(values)]
    assert task.payload["argv"][0].startswith("0.00123|00007|'a b'|4|deep|000")


def test_step4_plain_fields_fill_like_str_format() -> None:
    values = {"x": 1.5, "name": "a b", "flag": True, "n": None, "xs": [1, 2], "lr-rate": 0.1}
    template = "{x}/{name}/{flag}/{n}/{xs}/{lr-rate}/{{x}}/{x:}"
    [task] = expand({"command": [template], "env": {"V": "{name}"}, "task_params": [values]})
    assert task.payload["argv"] == [template.format_map(values)] == ["1.5/a b/True/None/[1, 2]/0.1/{x}/1.5"]
    assert task.payload["env"] == {"V": "a b"}


def test_step4_a_task_whose_argv_and_env_exceed_what_exec_takes_is_refused() -> None:
    big = "v" * (1024 * 1024)
    assert len(expand({"command": ["run", "{v}"], "task_params": [{"v": big}]})) == 1
    with pytest.raises(ValueError, match=r"^task 1: its argv and env come to 2097\d{3} bytes once filled from "
                                         r"task_params\[1\], more than the 2097152 a task may have"):
        expand({"command": ["run", "{v}"], "env": {"V": "{v}"},
                "task_params": [{"v": "small"}, {"v": big}]})


def test_step4_a_job_whose_tasks_together_exceed_the_cap_is_refused() -> None:
    """A placeholder repeated in many tokens multiplies a value: small body, huge job."""
    value = "v" * (64 * 1024)
    params = {"command": ["{v}"] * 16, "task_params": [{"v": value}] * 64}  # 64 tasks of 1 MiB each
    with pytest.raises(ValueError, match=r"^the argv and env of tasks 0\.\.63 come to \d+ bytes, more than the "
                                         r"67108864 one job's tasks may have together"):
        expand(params)
    assert len(expand({**params, "task_params": [{"v": value}] * 63})) == 63


# --- payload keys, TaskSpec fields ------------------------------------------------------------


def test_minimal_payload_has_exactly_the_always_keys() -> None:
    [task] = expand({"command": ["run"]})
    assert set(task.payload) == ALWAYS
    assert task.payload["image"] == "ghcr.io/acme/train:1.2"
    assert task.payload["isolation"] == {"tier": "sandboxed", "allowFallback": False}
    assert task.payload["inputs"] == {} and task.payload["env"] == {}
    assert task.payload["output_prefix"] == "jobs/job-1/task-000/"


def test_taskspec_fields_follow_the_job() -> None:
    tasks = expand({"command": ["run", "{i}"], "task_params": [{"i": 0}, {"i": 1}]}, attempts=7)
    for task in tasks:
        assert task.job_id == "job-1"
        assert task.commit_key == f"jobs/job-1/{task.task_id}/metrics.json"
        assert task.commit_key == task.payload["output_prefix"] + "metrics.json"
        assert task.max_attempts == 7 and task.max_expiries == 9
        assert task.lease_seconds == 60.0


def test_optional_keys_are_stamped_when_set() -> None:
    params = {
        "command": ["run"],
        "inputs": {"data": "artifact://d.tar", "cfg": "artifact://c.json"},
        "unpack_inputs": ["data"],
        "checkpoint": {"backend": "pytorch_dcp", "interval_seconds": 300},
        "local_inputs": ["imagenet"],
    }
    [task] = expand(params, pool="team-7", gpus=2)
    assert set(task.payload) == ALWAYS | {"checkpoint", "unpack_inputs", "local_inputs", "gpus", "pool"}
    assert task.payload["inputs"] == params["inputs"]
    assert task.payload["checkpoint"] == params["checkpoint"]
    assert task.payload["unpack_inputs"] == ["data"]
    assert task.payload["unpack_inputs"] is not params["unpack_inputs"]  # copied
    assert task.payload["local_inputs"] == ["imagenet"]
    assert task.payload["local_inputs"] is not params["local_inputs"]
    assert task.payload["gpus"] == 2 and type(task.payload["gpus"]) is int
    assert task.payload["pool"] == "team-7"


def test_pool_any_is_never_stamped_and_zero_gpus_is_absent() -> None:
    [task] = expand({"command": ["run"]}, pool="any", gpus=0)
    assert "pool" not in task.payload and "gpus" not in task.payload


def test_non_list_local_inputs_is_stamped_unchanged() -> None:
    [task] = expand({"command": ["run"], "local_inputs": "imagenet"})
    assert task.payload["local_inputs"] == "imagenet"  # gate 4 refuses it everywhere


def test_tasks_do_not_share_mutable_payload_parts() -> None:
    a, b = expand({"command": ["run", "{i}"], "task_params": [{"i": 0}, {"i": 1}],
                   "checkpoint": {"every": 5}, "local_inputs": ["ds"], "inputs": {"d": "artifact://d"}})
    a.payload["checkpoint"]["every"] = 99
    a.payload["local_inputs"].append("other")
    a.payload["inputs"]["x"] = "artifact://x"
    assert b.payload["checkpoint"] == {"every": 5}
    assert b.payload["local_inputs"] == ["ds"] and b.payload["inputs"] == {"d": "artifact://d"}


@pytest.mark.parametrize(("raw", "expected"), [(30, 30.0), ("45.5", 45.5), (10**6, float(MAX_LEASE_SECONDS))])
def test_lease_seconds_is_bounded(raw: Any, expected: float) -> None:
    [task] = expand({"command": ["run"], "lease_seconds": raw})
    assert task.lease_seconds == expected


@pytest.mark.parametrize("raw", [0, -5, "soon", True, math.nan, math.inf, [30]])
def test_invalid_lease_seconds_is_a_value_error(raw: Any) -> None:
    with pytest.raises(ValueError, match=r"parameters\.lease_seconds.*>= 1"):
        expand({"command": ["run"], "lease_seconds": raw})


def test_validate_output() -> None:
    RECIPE.validate_output({"loss": 0.1})
    with pytest.raises(ValueError, match="JSON object"):
        RECIPE.validate_output([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strings"):
        RECIPE.validate_output({1: 2})
