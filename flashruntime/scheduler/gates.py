"""The eight placement gates and ``IsolationAwarePlacement``.

Each gate is a pure function ``(payload, node) -> bool`` that passes when its
trigger is absent. Booleans are identity checks (``is True`` / ``is False``);
type-confused input never raises, it makes the task ineligible (fail-closed),
except the module gate, which fails open for availability. Isolation is
evaluated last so that its ``allowFallback`` waiver can never short-circuit
another gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flashruntime.protocol.v1alpha1 import TaskSpec
from flashruntime.scheduler.policy import NodeView, PlacementPolicy

__all__ = [
    "GATES",
    "IsolationAwarePlacement",
    "gate_argv",
    "gate_exclude_nodes",
    "gate_gang",
    "gate_gpus",
    "gate_isolation",
    "gate_local_inputs",
    "gate_module",
    "gate_pool",
]

_STANDARD_TIERS = ("", "standard")  # and None
_EMPTY: Mapping[str, Any] = {}


def _non_empty_str(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _allows_fallback(isolation: object) -> bool:
    return isinstance(isolation, dict) and isolation.get("allowFallback") is True


def _capabilities(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    capabilities = node.get("capabilities")
    return capabilities if isinstance(capabilities, dict) else None


def gate_isolation(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 1 (fail-closed; the only gate ``allowFallback`` waives): a non-standard
    tier needs a sandbox-capable node or an explicit fallback."""
    if "isolation" not in payload:
        return True
    isolation = payload["isolation"]
    if not isinstance(isolation, dict):
        return False
    tier = isolation.get("tier")
    if tier is None or (isinstance(tier, str) and tier in _STANDARD_TIERS):
        return True
    return isolation.get("allowFallback") is True or node.get("sandbox_capable") is True


def gate_argv(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 2 (fail-closed): an argv task needs an argv-capable node, a sandboxed-tier task a
    sandbox-capable node (a worker whose bubblewrap sandbox runs it), or the trusted-pool
    alternative: a named pool, an isolation fallback, and an unsandboxed-argv node."""
    if "argv" not in payload:
        return True
    if node.get("argv_capable") is True:
        return True
    isolation = payload.get("isolation")
    if isinstance(isolation, dict) and isolation.get("tier") == "sandboxed" and node.get("sandbox_capable") is True:
        return True
    return (
        _non_empty_str(payload.get("pool"))
        and _allows_fallback(payload.get("isolation"))
        and node.get("unsandboxed_argv_capable") is True
    )


def gate_module(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 3 (fail-open): a module task is refused only by a node saying ``module_capable: False``."""
    if "module" not in payload:
        return True
    return node.get("module_capable") is not False


def gate_local_inputs(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 4 (fail-closed): every named local input must be in the node's ``local_datasets`` list."""
    wanted = payload.get("local_inputs")
    if wanted is None:
        return True
    if not isinstance(wanted, list):
        return False
    if not wanted:
        return True
    held = node.get("local_datasets")
    if not isinstance(held, list):
        return False
    try:
        return all(name in held for name in wanted)
    except Exception:  # an exotic __eq__: type confusion, so ineligible
        return False


def gate_gpus(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 5 (fail-closed, one-directional): N > 0 GPUs need a node listing at least N."""
    wanted = payload.get("gpus")
    if wanted is None:
        return True
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
        return False
    if wanted == 0:
        return True
    capabilities = _capabilities(node)
    if capabilities is None:
        return False
    gpus = capabilities.get("gpus")
    return isinstance(gpus, list) and len(gpus) >= wanted


def gate_exclude_nodes(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 6 (fail-closed): the node must be identifiable and not excluded."""
    excluded = payload.get("exclude_nodes")
    if excluded is None:
        return True
    if not isinstance(excluded, list):
        return False
    if not excluded:
        return True
    if not all(isinstance(member, str) for member in excluded):
        return False
    node_id = node.get("node_id")
    return _non_empty_str(node_id) and node_id not in excluded


def gate_pool(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 7 (fail-closed, never waived): the task's pool must be one of the node's pools."""
    pool = payload.get("pool")
    if pool is None:
        return True
    if not _non_empty_str(pool):
        return False
    capabilities = _capabilities(node)
    if capabilities is None:
        return False
    pools = capabilities.get("pools")
    if not isinstance(pools, list) or not all(isinstance(member, str) for member in pools):
        return False
    return pool in pools


def gate_gang(payload: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Gate 8 (fail-closed): a node of a multi-node job goes to a machine that runs no other
    node of the same job (``gang_jobs`` in the claim view)."""
    gang = payload.get("gang")
    if gang is None:
        return True
    run_id = gang.get("run_id") if isinstance(gang, dict) else None
    held = node.get("gang_jobs")
    if not _non_empty_str(run_id) or not isinstance(held, list):
        return False
    return run_id not in held


GATES: tuple[tuple[str, Callable[[Mapping[str, Any], Mapping[str, Any]], bool]], ...] = (
    ("argv", gate_argv),
    ("module", gate_module),
    ("local_inputs", gate_local_inputs),
    ("gpus", gate_gpus),
    ("exclude_nodes", gate_exclude_nodes),
    ("pool", gate_pool),
    ("gang", gate_gang),
    ("isolation", gate_isolation),
)
"""The gates in evaluation order: 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 1 (isolation last)."""


class IsolationAwarePlacement(PlacementPolicy):
    """A task is eligible on a node when all eight gates pass."""

    def eligible(self, task: TaskSpec, node: NodeView) -> bool:
        return self.first_failing_gate(task, node) is None

    def first_failing_gate(self, task: TaskSpec, node: NodeView) -> str | None:
        """The name of the first gate (in evaluation order) that refuses, or None."""
        payload = getattr(task, "payload", None)
        if not isinstance(payload, Mapping):
            return "payload"
        view = node if isinstance(node, Mapping) else _EMPTY
        for name, gate in GATES:
            if not gate(payload, view):
                return name
        return None
