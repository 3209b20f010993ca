"""CommandWorkload, to_jobspec and compile_workload."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from flashruntime.protocol.plan_v1alpha1 import CheckpointPolicy
from flashruntime.protocol.v1alpha1 import ImageSpec, IsolationSpec
from flashruntime.strategies import LaunchSpec, StrategyCompiler, compiler_for, register_compiler
from flashruntime.strategies.command import compile_workload
from flashruntime.workloads.command import (
    CommandWorkload,
    OutputSpec,
    Source,
    collect_pattern_problem,
    task_params_problem,
    to_jobspec,
)

IMAGE = ImageSpec(repository="ghcr.io/acme/train", tag="1.2")


def test_defaults() -> None:
    w = CommandWorkload(command="python train.py")
    assert w.source == Source(path=".", git_revision=None)
    assert w.outputs == OutputSpec(prefix="artifact://jobs/{job_id}/", collect=["metrics.json"],
                                   primary_metric=None, maximize=True)
    assert (w.env, w.inputs, w.mode, w.checkpoint, w.task_params, w.image) == ({}, {}, "auto", None, None, None)
    assert w.isolation == IsolationSpec() and w.resources.spot_ok is True


def test_source_path_is_not_expanded_at_validation() -> None:
    assert Source(path="~/proj").path == "~/proj"


def test_argv_splits_strings_without_a_shell_and_copies_lists() -> None:
    assert CommandWorkload(command="python t.py --msg 'a b' ; rm -rf /").argv() == [
        "python", "t.py", "--msg", "a b", ";", "rm", "-rf", "/"
    ]
    tokens = ["python", "t.py"]
    w = CommandWorkload(command=tokens)
    argv = w.argv()
    argv.append("x")
    assert w.argv() == ["python", "t.py"]


def test_argv_formats_params_and_missing_placeholder_raises_keyerror() -> None:
    w = CommandWorkload(command="python t.py --lr {lr} --name run-{lr}")
    assert w.argv({"lr": 0.1}) == ["python", "t.py", "--lr", "0.1", "--name", "run-0.1"]
    with pytest.raises(KeyError, match="lr"):
        w.argv({"other": 1})


def test_a_placeholder_no_parameter_set_can_fill_is_named_with_its_task_token_key_and_fix() -> None:
    workload = CommandWorkload(command=["python", "t.py", "--c {C}"], task_params=[{"C": 1}, {"D": 1}])
    assert task_params_problem(workload) == (
        "task_params[1] has no key 'C' for the placeholder {C} in argv token '--c {C}' (keys: ['D']); "
        "add it to every parameter set, or write literal braces as '{{' and '}}'"
    )
    env = CommandWorkload(command="python t.py", env={"LR": "{lr:.3g}"}, task_params=[{"x": 1}])
    assert task_params_problem(env) == (
        "task_params[0] has no key 'lr' for the placeholder {lr:.3g} in env LR '{lr:.3g}' (keys: ['x']); "
        "add it to every parameter set, or write literal braces as '{{' and '}}'"
    )


@pytest.mark.parametrize(("command", "params", "message"), [
    ("t.py {}", {"lr": 1}, (r"task_params\[0\]: the placeholder \{\} in argv token '\{\}' is positional; name a "
                           r"key of the parameter set \(keys: \['lr'\]\), e.g. \{lr\}")),
    ("t.py {cfg[lr]}", {"cfg": {}}, (r"cannot fill the placeholder \{cfg\[lr\]\} in argv token '\{cfg\[lr\]\}' "
                                     r"\(keys: \['cfg'\]\): no key 'lr'; fix the placeholder or that parameter set")),
    ("t.py {i:05d}", {"i": "a"}, r"cannot fill the placeholder \{i:05d\} .*: Unknown format code 'd'"),
    ("t.py {lr", {"lr": 1}, r"cannot fill argv token '\{lr': expected '\}' before end of string; write literal"),
    ("t.py {x:e}", {"x": 10**400}, r"cannot fill the placeholder \{x:e\} .*: int too large to convert to float"),
])
def test_every_way_a_placeholder_fails_to_fill_is_named(command: str, params: dict, message: str) -> None:
    problem = task_params_problem(CommandWorkload(command=command, task_params=[params]))
    assert problem is not None and re.search(message, problem), problem
    with pytest.raises((KeyError, IndexError, ValueError, OverflowError)):  # what the launch would hit mid-run
        compile_workload(CommandWorkload(command=command, task_params=[params]), params)


@pytest.mark.parametrize("kwargs", [
    {"command": "python t.py --lr {lr} --tag {{x}} {cfg[a]:>4}", "task_params": [{"lr": 0.1, "cfg": {"a": 1}}]},
    {"command": "python t.py {lr} {", "task_params": None},  # no params: braces taken verbatim
    {"command": "python t.py {lr}", "task_params": []},
    {"command": "python t.py {lr}", "task_params": [{"x": 1}], "mode": "local"},  # no fan-out, no formatting
    {"command": "torchrun t.py {lr}", "task_params": [{"x": 1}], "mode": "coordinated"},
])
def test_workloads_the_launch_can_fill_or_never_formats_have_no_problem(kwargs: dict) -> None:
    assert task_params_problem(CommandWorkload(**kwargs)) is None


@pytest.mark.parametrize("kwargs, mode", [
    ({"command": "python t.py"}, "local"),
    ({"command": "torchrun --nproc-per-node=2 t.py"}, "coordinated"),
    ({"command": ["accelerate", "launch", "t.py"]}, "coordinated"),
    ({"command": "python t.py", "task_params": [{"a": 1}]}, "independent_tasks"),
    ({"command": "python t.py", "task_params": []}, "local"),
    ({"command": "torchrun t.py", "mode": "local"}, "local"),
    ({"command": "python t.py", "task_params": [{"a": 1}], "mode": "coordinated"}, "coordinated"),
])
def test_resolved_mode(kwargs: dict, mode: str) -> None:
    assert CommandWorkload(**kwargs).resolved_mode() == mode


def test_inputs_must_be_artifact_uris() -> None:
    assert CommandWorkload(command="x", inputs={"data": "artifact://d/x.csv"}).inputs["data"] == "artifact://d/x.csv"
    with pytest.raises(ValidationError, match="input 'data' is '/tmp/x.csv'; inputs must be artifact:// URIs"):
        CommandWorkload(command="x", inputs={"data": "/tmp/x.csv"})


@pytest.mark.parametrize("pattern, message", [
    ("", "pattern '' names no file"),
    (".", "pattern '.' names no file"),
    ("/abs/metrics.json", "pattern '/abs/metrics.json' is absolute; patterns are globs relative to the source"),
    ("../results/*.json", "pattern '../results/\\*.json' reaches outside the source directory with '..'"),
])
def test_collect_patterns_that_cannot_be_collected_are_named_but_still_build(pattern: str, message: str) -> None:
    """``submit()`` refuses them before launching (tests/integration/test_sdk_submit.py); an
    ``OutputSpec`` with one still builds, as it always did (no tightened input)."""
    problem = collect_pattern_problem(pattern)
    assert problem is not None and re.search(message, problem)
    assert OutputSpec(collect=["metrics.json", pattern]).collect == ["metrics.json", pattern]


def test_collect_patterns_relative_to_the_source_are_kept() -> None:
    patterns = ["metrics.json", "results/*.csv", "**/model.pt", "./metrics.json"]
    assert OutputSpec(collect=patterns).collect == patterns
    assert [collect_pattern_problem(pattern) for pattern in patterns] == [None] * 4


def test_to_jobspec() -> None:
    w = CommandWorkload(command="python t.py --lr {lr}", env={"A": "1"}, inputs={"d": "artifact://d"},
                        task_params=[{"lr": 0.1}], isolation=IsolationSpec(tier="sandboxed"),
                        checkpoint=CheckpointPolicy(backend="local_manifest"))
    spec = to_jobspec(w, "sweep-a", IMAGE)
    assert spec.metadata.name == "sweep-a" and spec.spec.execution.backend == "leases"
    assert spec.spec.image == IMAGE and spec.spec.workload.type == "command"
    assert spec.spec.isolation.tier == "sandboxed"
    assert spec.spec.workload.parameters == {
        "command": ["python", "t.py", "--lr", "{lr}"], "env": {"A": "1"}, "inputs": {"d": "artifact://d"},
        "task_params": [{"lr": 0.1}],
        "checkpoint": {"backend": "local_manifest", "interval_seconds": 300, "note": ""},
    }
    plain = to_jobspec(CommandWorkload(command="x", image=IMAGE), "a").spec.workload.parameters
    assert set(plain) == {"command", "env", "inputs"}


def test_to_jobspec_without_an_image_leaves_it_out_and_checks_the_name() -> None:
    assert to_jobspec(CommandWorkload(command="x"), "a").spec.image is None
    with pytest.raises(ValidationError, match="DNS-1123"):
        to_jobspec(CommandWorkload(command="x"), "Bad_Name", IMAGE)


def test_compile_workload_plain() -> None:
    spec = compile_workload(CommandWorkload(command="python t.py --lr {lr}", env={"TAG": "lr-{lr}"},
                                            source=Source(path="~/p")), {"lr": 0.5})
    assert spec == LaunchSpec(argv=["python", "t.py", "--lr", "0.5"], env={"TAG": "lr-0.5"}, world_size=1,
                              workdir_hint="~/p", notes=["mode=local"])
    untouched = compile_workload(CommandWorkload(command="python t.py", env={"T": "{x}"}))
    assert untouched.env == {"T": "{x}"}


@pytest.mark.parametrize("command, world_size, unresolved", [
    ("torchrun --nproc-per-node=4 t.py", 4, False),
    ("torchrun --nproc_per_node 3 t.py", 3, False),
    ("torchrun --nproc_per_node=2 --nnodes=2 t.py", 2, False),
    ("torchrun --nproc-per-node auto t.py", 1, True),
    ("torchrun t.py", 1, False),
    ("python --nproc-per-node=4 t.py", 1, False),
    # Only torchrun's own options count: the script's arguments are the script's.
    ("torchrun --standalone train.py --nproc-per-node=8", 1, False),
    ("torchrun --standalone train.py --nproc_per_node 8", 1, False),
    ("torchrun --nnodes 2 --nproc-per-node 4 train.py --nproc-per-node=8", 4, False),
    ("torchrun --rdzv-endpoint h:29400 --nproc_per_node=3 --standalone t.py --nproc-per-node auto", 3, False),
    ("torchrun -m pkg.train --nproc-per-node=8", 1, False),
    ("torchrun --nproc-per-node=2 -m pkg.train --nproc-per-node=8", 2, False),
    ("torchrun --no-python --nproc_per_node 6 echo --nproc_per_node 8", 6, False),
])
def test_compile_workload_torchrun_world_size(command: str, world_size: int, unresolved: bool) -> None:
    spec = compile_workload(CommandWorkload(command=command))
    assert spec.world_size == world_size
    assert any("unresolved" in n for n in spec.notes) is unresolved
    assert spec.notes[0].startswith("mode=")


def test_launch_spec_bounds() -> None:
    with pytest.raises(ValidationError):
        LaunchSpec(argv=["x"], world_size=0)
    with pytest.raises(ValidationError):
        LaunchSpec(argv=["x"], gpus_per_process=-1)


def test_compiler_registry() -> None:
    class Family:
        def __init__(self, family: str) -> None:
            self.strategy_family = family

    class DdpCompiler(StrategyCompiler):
        family = "test_ddp"

        def supports(self, plan: object) -> bool:
            return getattr(plan, "strategy_family", None) == "test_ddp"

        def compile(self, plan: object) -> LaunchSpec:
            return LaunchSpec(argv=["torchrun", "t.py"])

    with pytest.raises(LookupError, match="no strategy compiler supports family 'test_ddp'"):
        compiler_for(Family("test_ddp"))
    first, second = DdpCompiler(), DdpCompiler()
    register_compiler(first)
    register_compiler(second)  # same family: replaces
    assert compiler_for(Family("test_ddp")) is second
    assert second.validate(Family("test_ddp")) == []
    assert "unsupported plan" in second.validate(Family("fsdp2"))[0]
