"""The key walker behind the CLI's "is not a field ... and is ignored" warnings: nested
models, lists and dicts of models, aliases, discriminated unions, and free-form dicts
whose keys are never warned about (unknown fields are ignored, so the
CLI says so instead of refusing)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from flashruntime.cli._unknown_keys import UnknownKey, unknown_keys, warning_lines
from flashruntime.protocol.plan_v1alpha1 import PlanRequest
from flashruntime.protocol.v1alpha1 import JobSpec


class Leaf(BaseModel):
    name: str = ""
    max_steps: int = 0


class Aliased(BaseModel):
    learning_rate: float = Field(default=0.1, alias="learningRate")
    batch: int = Field(default=1, validation_alias=AliasChoices("batch", "batchSize"))


class ByName(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    learning_rate: float = Field(default=0.1, alias="learningRate")


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")

    leaf: Leaf = Field(default_factory=Leaf)


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"
    purr: bool = True


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"
    bark: bool = True


class Root(BaseModel):
    leaf: Leaf = Field(default_factory=Leaf)
    maybe: Leaf | None = None
    leaves: list[Leaf] = Field(default_factory=list)
    named: dict[str, Leaf] = Field(default_factory=dict)
    aliased: Aliased = Field(default_factory=Aliased)
    by_name: ByName = Field(default_factory=ByName)
    open: Open = Field(default_factory=Open)
    pet: Cat | Dog = Field(default_factory=Cat, discriminator="kind")
    either: Cat | Dog | None = None  # no discriminator: which arm is unknowable
    payload: dict[str, Any] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


def _paths(data: Any) -> list[str]:
    return [unknown.path for unknown in unknown_keys(Root, data)]


def test_a_valid_document_has_no_unknown_keys() -> None:
    assert _paths({"leaf": {"name": "a"}, "maybe": None, "leaves": [{"max_steps": 1}], "pet": {"kind": "dog"}}) == []


def test_unknown_keys_are_found_at_every_depth_in_document_order() -> None:
    data = {
        "lief": {},
        "leaf": {"nmae": "a", "name": "b"},
        "maybe": {"max_step": 3},
        "leaves": [{"name": "ok"}, {"max-steps": 2}],
        "named": {"first": {"nam": "x"}},
    }
    assert unknown_keys(Root, data) == [
        UnknownKey("lief", "leaf"),
        UnknownKey("leaf.nmae", "name"),
        UnknownKey("maybe.max_step", "max_steps"),
        UnknownKey("leaves[1].max-steps", "max_steps"),
        UnknownKey("named.first.nam", "name"),
    ]


def test_aliases_are_the_keys_pydantic_reads() -> None:
    assert _paths({"aliased": {"learningRate": 1, "batchSize": 2, "batch": 3}}) == []
    # without populate_by_name the field's own name is ignored by validation: warned, pointing at the alias
    assert unknown_keys(Root, {"aliased": {"learning_rate": 1}}) == [
        UnknownKey("aliased.learning_rate", "learningRate")
    ]
    assert _paths({"by_name": {"learning_rate": 1, "learningRate": 2}}) == []


def test_free_form_dicts_and_extra_allow_models_are_never_warned_about() -> None:
    assert _paths({"payload": {"anything": {"nested": 1}}, "labels": {"team": "x"}, "open": {"kept": 1}}) == []
    assert _paths({"open": {"leaf": {"nmae": 1}}}) == ["open.leaf.nmae"]  # its declared fields are still walked


def test_a_discriminated_union_is_walked_as_the_arm_its_tag_selects() -> None:
    assert _paths({"pet": {"kind": "dog", "bark": True, "purr": True}}) == ["pet.purr"]
    assert _paths({"pet": {"kind": "cat", "purr": True}}) == []
    assert _paths({"pet": {"kind": "fish", "fins": 2}}) == []  # validation refuses it; no guessing here
    assert _paths({"either": {"kind": "dog", "purr": True}}) == []


@pytest.mark.parametrize("data", [None, [], "text", 3, {"leaf": "text", "leaves": {"a": 1}}])
def test_values_that_are_not_objects_are_left_to_validation(data: Any) -> None:
    assert _paths(data) == []


def test_a_key_that_is_not_a_string_is_unknown() -> None:
    assert _paths({1: "yaml int key"}) == ["1"]


def test_suggestions_ignore_case_and_separators_and_only_name_close_keys() -> None:
    [camel] = unknown_keys(JobSpec, {"spec": {"retry_policy": {"max_task_attempts": 2}}})
    assert camel == UnknownKey("spec.retry_policy", "retryPolicy")
    assert unknown_keys(JobSpec, {"spec": {"retryPolicy": {"max_task_attempts": 2}}}) == [
        UnknownKey("spec.retryPolicy.max_task_attempts", "maxTaskAttempts")
    ]
    assert unknown_keys(Root, {"zzzzzz": 1}) == [UnknownKey("zzzzzz", None)]


def test_request_models_warning_lines() -> None:
    plan = {"workload": {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "methd": "lora"}}
    assert warning_lines("plan", PlanRequest, plan) == [
        ("flashruntime plan: warning: workload.methd is not a field of PlanRequest and is ignored "
         "(did you mean 'method'?)")
    ]
    job = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "a", "labels": {"x": "1"}},
           "spec": {"image": {"repository": "r", "tag": "1"}, "workload": {"type": "command", "parameters": {"k": 1}},
                    "resources": {"gpuPerTask": 1, "maximumWorker": 2}}}
    assert warning_lines("submit-spec", JobSpec, job) == [
        ("flashruntime submit-spec: warning: spec.resources.maximumWorker is not a field of JobSpec and is ignored "
         "(did you mean 'maximumWorkers'?)")
    ]
