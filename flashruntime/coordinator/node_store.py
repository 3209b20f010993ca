"""The node store contract: ``StoredNode``, the ``NodeStore`` protocol (what each method
MUST do) and the in-memory implementation.

A store keeps what a node registered with, when the coordinator last recorded hearing
from it, and how many of its commits were accepted; ``SqliteNodeStore``
(``flashruntime.coordinator.sqlite_node_store``) keeps them across a restart. Whether a
node is online is not stored: the registry decides it from what this process has heard.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flashruntime.protocol.v1alpha1 import NodeRegistration

__all__ = ["InMemoryNodeStore", "NodeStore", "StoredNode"]


@dataclass(frozen=True)
class StoredNode:
    """A node as stored: its registration (with the pools a heartbeat last stated), the
    epoch seconds of the last registration or recorded heartbeat, and its accepted commits."""

    registration: NodeRegistration
    last_seen: float
    accepted: int = 0


@runtime_checkable
class NodeStore(Protocol):
    """The contract of a node store. Every method is atomic on its own; on a store that
    shares a database transaction, a call made inside one commits with it."""

    def register(self, registration: NodeRegistration, seen_at: float) -> None:
        """Store ``registration``, replacing the stored one of the same ``node_id``, with
        ``last_seen = seen_at``. A re-registration MUST keep the accepted count."""
        ...

    def get(self, node_id: str) -> StoredNode | None:
        """The node, or None when it never registered. What comes back equals what was stored."""
        ...

    def all(self) -> list[StoredNode]:
        """Every node, sorted by ``node_id``."""
        ...

    def set_pools(self, node_id: str, pools: list[str]) -> bool:
        """Replace the registration's ``capabilities.pools`` with ``pools`` (nothing else
        changes); False, storing nothing, when the node is unknown."""
        ...

    def seen(self, node_id: str, at: float) -> bool:
        """Record that the node was heard from at ``at``: ``last_seen`` becomes the later of
        the two; False, storing nothing, when the node is unknown."""
        ...

    def count_accepted(self, node_id: str) -> bool:
        """Add one to the node's accepted count; False, storing nothing, when it is unknown."""
        ...


class InMemoryNodeStore:
    """Nodes in a dict, for the coordinator's lifetime only. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, StoredNode] = {}

    def register(self, registration: NodeRegistration, seen_at: float) -> None:
        with self._lock:
            known = self._nodes.get(registration.node_id)
            accepted = known.accepted if known is not None else 0
            self._nodes[registration.node_id] = StoredNode(registration.model_copy(deep=True), float(seen_at),
                                                           accepted)

    def get(self, node_id: str) -> StoredNode | None:
        with self._lock:
            node = self._nodes.get(node_id)
        return None if node is None else _copy(node)

    def all(self) -> list[StoredNode]:
        with self._lock:
            nodes = sorted(self._nodes.items())
        return [_copy(node) for _, node in nodes]

    def set_pools(self, node_id: str, pools: list[str]) -> bool:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return False
            capabilities = node.registration.capabilities.model_copy(update={"pools": list(pools)})
            registration = node.registration.model_copy(update={"capabilities": capabilities})
            self._nodes[node_id] = StoredNode(registration, node.last_seen, node.accepted)
            return True

    def seen(self, node_id: str, at: float) -> bool:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return False
            self._nodes[node_id] = StoredNode(node.registration, max(node.last_seen, float(at)), node.accepted)
            return True

    def count_accepted(self, node_id: str) -> bool:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return False
            self._nodes[node_id] = StoredNode(node.registration, node.last_seen, node.accepted + 1)
            return True


def _copy(node: StoredNode) -> StoredNode:
    """A copy whose registration the caller may change without changing the stored one."""
    return StoredNode(node.registration.model_copy(deep=True), node.last_seen, node.accepted)
