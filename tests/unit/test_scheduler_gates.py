"""The seven placement gates: accept, reject and type-confused input for
each, their order (isolation last) and polarity, and that the ``allowFallback``
waiver never short-circuits another gate."""

from __future__ import annotations

from typing import Any

import pytest

from flashruntime.protocol.v1alpha1 import TaskSpec
from flashruntime.scheduler import IsolationAwarePlacement
from flashruntime.scheduler.gates import GATES

POLICY = IsolationAwarePlacement()


def task(**payload: Any) -> TaskSpec:
    return TaskSpec(task_id="t", job_id="j", commit_key="k", payload=payload)


def eligible(payload: dict[str, Any], node: Any) -> bool:
    return POLICY.eligible(task(**payload), node)


BARE: dict[str, Any] = {"node_id": "n1"}
FALLBACK = {"tier": "gvisor", "allowFallback": True}
CONFUSED = [None, 0, 1, 1.5, "", "x", True, False, [], {}, ["x"], {"a": 1}, object()]


def test_gate_order_is_2_to_8_then_isolation() -> None:
    assert [name for name, _ in GATES] == ["argv", "module", "local_inputs", "gpus", "exclude_nodes", "pool", "gang",
                                           "isolation"]


def test_no_triggers_means_eligible_everywhere() -> None:
    for node in (BARE, {}, {"node_id": ""}, None, "not-a-node", 42):
        assert eligible({}, node) is True
    assert eligible({"unrelated": [1, 2]}, BARE) is True


# --- gate 1: isolation ----------------------------------------------------------


@pytest.mark.parametrize("tier", [None, "", "standard"])
def test_isolation_standard_tiers_pass(tier: Any) -> None:
    assert eligible({"isolation": {"tier": tier}}, BARE)
    assert eligible({"isolation": {}}, BARE)


@pytest.mark.parametrize("tier", ["gvisor", "kata", "Standard", "sandbox", 3, ["gvisor"], {"x": 1}, True])
def test_isolation_other_tiers_need_sandbox_or_fallback(tier: Any) -> None:
    payload = {"isolation": {"tier": tier}}
    assert not eligible(payload, BARE)
    assert not eligible(payload, {"node_id": "n", "sandbox_capable": "yes"})  # identity, not truthiness
    assert not eligible(payload, {"node_id": "n", "sandbox_capable": 1})
    assert eligible(payload, {"node_id": "n", "sandbox_capable": True})
    assert eligible({"isolation": {"tier": tier, "allowFallback": True}}, BARE)
    assert not eligible({"isolation": {"tier": tier, "allowFallback": "true"}}, BARE)
    assert not eligible({"isolation": {"tier": tier, "allowFallback": 1}}, BARE)


@pytest.mark.parametrize("isolation", [None, "gvisor", "", 0, [], ["tier"], True])
def test_isolation_not_a_dict_is_ineligible_everywhere(isolation: Any) -> None:
    assert not eligible({"isolation": isolation}, {"node_id": "n", "sandbox_capable": True})


# --- gate 2: argv ----------------------------------------------------------------


def test_argv_needs_argv_capable_node() -> None:
    assert eligible({"argv": ["python", "x.py"]}, {"node_id": "n", "argv_capable": True})
    assert not eligible({"argv": ["python"]}, BARE)
    assert not eligible({"argv": ["python"]}, {"node_id": "n", "argv_capable": "True"})
    assert not eligible({"argv": None}, BARE)  # the key's presence triggers the gate


def test_argv_trusted_pool_alternative_needs_every_leg() -> None:
    trusted = {"node_id": "n", "unsandboxed_argv_capable": True, "capabilities": {"pools": ["lab"]}}
    payload = {"argv": ["x"], "pool": "lab", "isolation": {"tier": "gvisor", "allowFallback": True}}
    assert eligible(payload, trusted)
    assert not eligible({**payload, "pool": ""}, trusted)
    assert not eligible({k: v for k, v in payload.items() if k != "pool"}, trusted)
    assert not eligible({**payload, "isolation": {"tier": "gvisor"}}, trusted)
    assert not eligible({**payload, "isolation": "fallback"}, trusted)
    assert not eligible(payload, {**trusted, "unsandboxed_argv_capable": 1})
    assert not eligible(payload, {k: v for k, v in trusted.items() if k != "unsandboxed_argv_capable"})


def test_argv_waiver_does_not_waive_the_pool_gate() -> None:
    payload = {"argv": ["x"], "pool": "lab", "isolation": {"tier": "gvisor", "allowFallback": True}}
    node = {"node_id": "n", "unsandboxed_argv_capable": True, "capabilities": {"pools": ["other"]}}
    assert not eligible(payload, node)
    assert POLICY.first_failing_gate(task(**payload), node) == "pool"


# --- gate 3: module (fail-open) ----------------------------------------------------------


def test_module_fails_open_except_explicit_false() -> None:
    payload = {"module": "flashml_workloads.sgd_trainer"}
    assert eligible(payload, BARE)
    assert eligible(payload, {"node_id": "n", "module_capable": None})
    assert eligible(payload, {"node_id": "n", "module_capable": 0})  # identity: only False refuses
    assert eligible(payload, {"node_id": "n", "module_capable": True})
    assert eligible(payload, None)
    assert not eligible(payload, {"node_id": "n", "module_capable": False})


# --- gate 4: local_inputs -------------------------------------------------------------------


def test_local_inputs() -> None:
    node = {"node_id": "n", "local_datasets": ["imagenet", "coco"]}
    assert eligible({"local_inputs": ["coco"]}, node)
    assert eligible({"local_inputs": ["coco", "imagenet"]}, node)
    assert eligible({"local_inputs": []}, BARE)
    assert eligible({"local_inputs": None}, BARE)
    assert not eligible({"local_inputs": ["coco", "laion"]}, node)
    assert not eligible({"local_inputs": ["coco"]}, BARE)
    assert not eligible({"local_inputs": ["coco"]}, {"node_id": "n", "local_datasets": "coco"})  # str is no list
    assert not eligible({"local_inputs": ["coco"]}, {"node_id": "n", "local_datasets": ("coco",)})


@pytest.mark.parametrize("bad", ["coco", ("coco",), {"coco": 1}, 1, True])
def test_local_inputs_not_a_list_is_ineligible_everywhere(bad: Any) -> None:
    assert not eligible({"local_inputs": bad}, {"node_id": "n", "local_datasets": ["coco", "c", "o"]})


# --- gate 5: gpus ---------------------------------------------------------------------------------


def gpu_node(count: int) -> dict[str, Any]:
    return {"node_id": "n", "capabilities": {"gpus": [{"index": i} for i in range(count)]}}


def test_gpus() -> None:
    assert eligible({"gpus": 2}, gpu_node(2))
    assert eligible({"gpus": 2}, gpu_node(4))
    assert not eligible({"gpus": 2}, gpu_node(1))
    assert eligible({"gpus": 0}, BARE)
    assert eligible({"gpus": None}, BARE)
    assert eligible({}, gpu_node(8))  # one-directional: GPU hosts take CPU work
    assert not eligible({"gpus": 1}, BARE)
    assert not eligible({"gpus": 1}, {"node_id": "n", "capabilities": {"gpus": 1}})
    assert not eligible({"gpus": 1}, {"node_id": "n", "capabilities": [{"gpus": [1]}]})


@pytest.mark.parametrize("bad", [True, False, -1, 1.0, "1", [1], {"n": 1}])
def test_gpus_type_confused_is_ineligible_everywhere(bad: Any) -> None:
    assert not eligible({"gpus": bad}, gpu_node(8))


# --- gate 6: exclude_nodes ----------------------------------------------------------------------------


def test_exclude_nodes() -> None:
    assert not eligible({"exclude_nodes": ["n1"]}, BARE)
    assert eligible({"exclude_nodes": ["n2"]}, BARE)
    assert eligible({"exclude_nodes": []}, {})  # empty excludes nobody, even an anonymous node
    assert eligible({"exclude_nodes": None}, BARE)
    assert not eligible({"exclude_nodes": ["n2"]}, {})  # unidentifiable node
    assert not eligible({"exclude_nodes": ["n2"]}, {"node_id": ""})
    assert not eligible({"exclude_nodes": ["n2"]}, {"node_id": 7})


@pytest.mark.parametrize("bad", ["n1", ("n2",), {"n2"}, 1, ["n2", 3], ["n2", None]])
def test_exclude_nodes_type_confused_is_ineligible(bad: Any) -> None:
    assert not eligible({"exclude_nodes": bad}, BARE)


# --- gate 7: pool ---------------------------------------------------------------------------------------


def pool_node(pools: Any) -> dict[str, Any]:
    return {"node_id": "n", "capabilities": {"pools": pools}}


def test_pool() -> None:
    assert eligible({"pool": "lab"}, pool_node(["lab", "cloud"]))
    assert not eligible({"pool": "lab"}, pool_node(["cloud"]))
    assert not eligible({"pool": "lab"}, BARE)
    assert not eligible({"pool": "lab"}, pool_node("lab"))  # a string is not a list
    assert not eligible({"pool": "lab"}, pool_node(["lab", 1]))  # only strings
    assert not eligible({"pool": "lab"}, {"node_id": "n", "capabilities": "pools"})
    assert eligible({"pool": None}, BARE)


@pytest.mark.parametrize("bad", ["", 1, ["lab"], True, {"lab": 1}])
def test_pool_type_confused_is_ineligible(bad: Any) -> None:
    assert not eligible({"pool": bad}, pool_node(["lab", ""]))


def test_pool_is_not_waived_by_allow_fallback() -> None:
    payload = {"pool": "lab", "isolation": FALLBACK}
    assert not eligible(payload, pool_node(["cloud"]))
    assert eligible(payload, pool_node(["lab"]))


# --- the waiver never short-circuits another gate --------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "node", "gate"),
    [
        ({"argv": ["x"]}, BARE, "argv"),
        ({"module": "m"}, {"node_id": "n1", "module_capable": False}, "module"),
        ({"local_inputs": ["d"]}, BARE, "local_inputs"),
        ({"gpus": 1}, BARE, "gpus"),
        ({"exclude_nodes": ["n1"]}, BARE, "exclude_nodes"),
        ({"pool": "lab"}, BARE, "pool"),
    ],
)
def test_waiver_never_short_circuits(payload: dict[str, Any], node: dict[str, Any], gate: str) -> None:
    for isolation in (FALLBACK, {"tier": "standard"}, {"tier": "gvisor", "allowFallback": True, "x": 1}):
        full = {**payload, "isolation": isolation}
        assert not eligible(full, {**node, "sandbox_capable": True})
        assert POLICY.first_failing_gate(task(**full), node) == gate


def test_isolation_is_reported_only_when_everything_else_passes() -> None:
    payload = {"pool": "lab", "gpus": 1, "isolation": {"tier": "gvisor"}}
    node = {"node_id": "n", "capabilities": {"pools": ["lab"], "gpus": [{}]}}
    assert POLICY.first_failing_gate(task(**payload), node) == "isolation"
    assert POLICY.first_failing_gate(task(**payload), {**node, "sandbox_capable": True}) is None


@pytest.mark.parametrize("node", CONFUSED)
def test_type_confused_node_views_never_raise(node: Any) -> None:
    payloads = [
        {"argv": ["x"]},
        {"module": "m"},
        {"local_inputs": ["d"]},
        {"gpus": 1},
        {"exclude_nodes": ["n"]},
        {"pool": "p"},
        {"isolation": {"tier": "gvisor"}},
    ]
    for payload in payloads:
        assert isinstance(eligible(payload, node), bool)


@pytest.mark.parametrize("value", CONFUSED)
def test_type_confused_payload_values_never_raise(value: Any) -> None:
    node = {
        "node_id": "n",
        "argv_capable": True,
        "sandbox_capable": True,
        "local_datasets": ["x"],
        "capabilities": {"gpus": [{}], "pools": ["x"]},
    }
    for key in ("argv", "module", "local_inputs", "gpus", "exclude_nodes", "pool", "isolation"):
        assert isinstance(eligible({key: value}, node), bool)
    assert isinstance(eligible({"isolation": {"tier": value, "allowFallback": value}}, node), bool)


def test_payload_that_is_not_a_mapping_is_ineligible() -> None:
    forged = TaskSpec.model_construct(task_id="t", job_id="j", commit_key="k", payload=["argv"])
    assert POLICY.eligible(forged, BARE) is False
