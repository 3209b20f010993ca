"""Node grants: what the operator lets each credential serve, and how a node's statement is cut."""

from __future__ import annotations

import pytest

from flashruntime.coordinator.auth import authenticator_from_env
from flashruntime.coordinator.node_grants import (
    NodeGrant,
    grant_statement,
    node_grants_for,
    node_grants_from_env,
)
from flashruntime.coordinator.nodes import NodeRegistry
from flashruntime.errors import AuthConfigError
from flashruntime.protocol.v1alpha1 import NodeCapabilities, NodeHeartbeat, NodeRegistration

NODES = {"node-a", "node-b"}


def grants(enforcing: bool = True, join_code_set: bool = False, **env: str):
    return node_grants_from_env(env, node_ids=NODES if enforcing else (), enforcing=enforcing,
                                join_code_set=join_code_set)


def test_node_pools_and_unsandboxed_nodes_parse_per_token() -> None:
    parsed = grants(FLASHML_NODE_POOLS=" node-a:finance-team|ml , node-b:ml,", FLASHML_UNSANDBOXED_NODES="node-a")
    assert parsed.for_node("node-a") == NodeGrant(frozenset({"finance-team", "ml"}), True)
    assert parsed.for_node("node-b") == NodeGrant(frozenset({"ml"}), False)


def test_a_node_token_with_nothing_configured_is_granted_nothing() -> None:
    assert grants().for_node("node-a") == NodeGrant(frozenset(), False)
    assert grants(FLASHML_NODE_POOLS="node-b:ml").for_node("node-a") == NodeGrant()


def test_open_mode_bounds_nothing_and_a_join_code_bounds_by_its_own_grant() -> None:
    assert grants(enforcing=False).for_node("anyone") is None
    assert grants(enforcing=False, join_code_set=True).for_node("anyone") == NodeGrant()
    joined = grants(enforcing=False, join_code_set=True, FLASHML_JOIN_CODE_POOLS="ml|cpu",
                    FLASHML_JOIN_CODE_UNSANDBOXED="1")
    assert joined.for_node("anyone") == NodeGrant(frozenset({"ml", "cpu"}), True)


@pytest.mark.parametrize(("env", "message"), [
    ({"FLASHML_NODE_POOLS": "node-a"}, r"FLASHML_NODE_POOLS entry 1 .*no node id before ':'.*node_id:pool\|pool"),
    ({"FLASHML_NODE_POOLS": ":ml"}, r"FLASHML_NODE_POOLS entry 1 .*no node id"),
    ({"FLASHML_NODE_POOLS": "node-a:"}, r"FLASHML_NODE_POOLS entry 1 \(node 'node-a'\) grants no pool"),
    ({"FLASHML_NODE_POOLS": "node-a:ml|"}, r"pool '' is not a pool name"),
    ({"FLASHML_NODE_POOLS": "node-a:ml team"}, r"pool 'ml team' is not a pool name"),
    ({"FLASHML_NODE_POOLS": "ghost:ml"}, r"entry 1 \(node 'ghost'\) names a node with no token in FLASHML_NODE_TOKENS"),
    ({"FLASHML_NODE_POOLS": "node-a:ml,node-a:cpu"}, r"entry 2 \(node 'node-a'\) repeats a node"),
    ({"FLASHML_UNSANDBOXED_NODES": "node-a,ghost"}, r"FLASHML_UNSANDBOXED_NODES names 'ghost', which has no token"),
    ({"FLASHML_JOIN_CODE_POOLS": "ml"}, r"FLASHML_JOIN_CODE_POOLS .*tokens are configured.*FLASHML_NODE_POOLS"),
])
def test_malformed_grants_are_refused_naming_the_variable_and_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(AuthConfigError, match=message):
        grants(**env)


@pytest.mark.parametrize(("env", "message"), [
    ({"FLASHML_JOIN_CODE_POOLS": "ml"}, r"FLASHML_JOIN_CODE_POOLS .*no join code is configured.*FLASHML_JOIN_CODE"),
    ({"FLASHML_JOIN_CODE_UNSANDBOXED": "yes"}, r"FLASHML_JOIN_CODE_UNSANDBOXED is 'yes'; set it to 1 .* or 0"),
    ({"FLASHML_JOIN_CODE_POOLS": "a,b"}, r"FLASHML_JOIN_CODE_POOLS: pool 'a,b' is not a pool name.*'ml\|cpu'"),
    ({"FLASHML_NODE_POOLS": "node-a:ml"}, r"names a node with no token"),
])
def test_malformed_grants_without_tokens_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(AuthConfigError, match=message):
        grants(enforcing=False, **env)


def test_grants_follow_the_coordinators_authenticator() -> None:
    env = {"FLASHML_NODE_TOKENS": "node-a:tok-a", "FLASHML_NODE_POOLS": "node-a:ml"}
    parsed = node_grants_for(authenticator_from_env(env), join_code_set=False, env=env)
    assert parsed.enforcing and parsed.for_node("node-a") == NodeGrant(frozenset({"ml"}))
    with pytest.raises(AuthConfigError, match="'node-b'"):
        env = {"FLASHML_NODE_TOKENS": "node-a:tok-a", "FLASHML_UNSANDBOXED_NODES": "node-b"}
        node_grants_for(authenticator_from_env(env), join_code_set=False, env=env)


def test_a_statement_is_cut_to_its_grant() -> None:
    cut = grant_statement(["finance-team", "ml"], True, NodeGrant(frozenset({"ml"}), False))
    assert (cut.pools, cut.unsandboxed_argv, cut.withheld_pools, cut.withheld_unsandboxed_argv) == (
        ["ml"], False, ["finance-team"], True)
    assert cut.withheld
    kept = grant_statement(["ml"], False, None)
    assert (kept.pools, kept.withheld) == (["ml"], False)


def _registration(node_id: str, pools: list[str], unsandboxed: bool) -> NodeRegistration:
    return NodeRegistration(node_id=node_id, kubernetes_node="", hostname=node_id,
                            capabilities=NodeCapabilities(pools=pools), unsandboxed_argv_capable=unsandboxed)


def test_the_registry_stores_and_places_only_what_was_granted() -> None:
    nodes = NodeRegistry()
    grant = NodeGrant(frozenset({"ml"}), False)
    granted = nodes.register(_registration("node-a", ["finance-team", "ml"], True), grant)
    assert granted.withheld_pools == ["finance-team"] and granted.withheld_unsandboxed_argv
    stored = nodes.get("node-a")
    assert stored is not None and stored.capabilities.pools == ["ml"] and not stored.unsandboxed_argv_capable
    # A heartbeat stating pools again is cut the same way.
    assert nodes.heartbeat("node-a", NodeHeartbeat(node_id="node-a", pools=["finance-team"]), grant)
    view = nodes.claim_view("node-a", grant)
    assert view is not None and view["capabilities"]["pools"] == [] and view["unsandboxed_argv_capable"] is False


def test_a_withdrawn_grant_is_withdrawn_from_the_next_claim() -> None:
    nodes = NodeRegistry()
    nodes.register(_registration("node-a", ["finance-team"], True), NodeGrant(frozenset({"finance-team"}), True))
    assert nodes.claim_view("node-a", NodeGrant(frozenset({"finance-team"}), True))["capabilities"]["pools"] == [
        "finance-team"]
    view = nodes.claim_view("node-a", NodeGrant())  # the operator's grant after a restart
    assert view["capabilities"]["pools"] == [] and view["unsandboxed_argv_capable"] is False
