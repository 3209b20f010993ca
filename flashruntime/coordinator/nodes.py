"""The coordinator's node registry: registrations and liveness, in memory, and the
rule for node ids.

Agents re-register after a coordinator restart (their heartbeat gets a 404), so
nothing here needs to be durable. The clock is injected so tests can age nodes.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flashruntime.protocol.v1alpha1 import NodeHeartbeat, NodeRegistration

__all__ = ["MAX_NODE_ID_LENGTH", "ONLINE_WINDOW_S", "NodeRegistry", "node_id_problem"]

ONLINE_WINDOW_S = 15.0  # a node is online if it registered or heartbeated this recently
MAX_NODE_ID_LENGTH = 128
# A node id names a machine in URL paths, token lists ("node:token,...") and logs: a
# hostname-like word, so it needs no escaping anywhere.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")


def node_id_problem(node_id: object) -> str | None:
    """Why ``node_id`` cannot name a node, or None: 1 to 128 characters, letters, digits
    and ``. _ @ + -``, starting with a letter or digit (a hostname fits)."""
    if not isinstance(node_id, str) or not node_id:
        return "a node id must be a non-empty string"
    if len(node_id) > MAX_NODE_ID_LENGTH:
        return f"a node id is at most {MAX_NODE_ID_LENGTH} characters, this one has {len(node_id)}"
    if not _NODE_ID.fullmatch(node_id):
        return ("a node id holds only letters, digits and '.', '_', '@', '+', '-', and starts with a letter "
                "or digit (a hostname fits)")
    return None

Cordons = Mapping[str, tuple[datetime | None, str]]


@dataclass
class _Node:
    registration: NodeRegistration
    last_seen: float
    accepted: int = 0


class NodeRegistry:
    """Registered nodes by id; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}

    def register(self, registration: NodeRegistration) -> None:
        """Store (or replace) a registration; a re-registration keeps the accepted count."""
        with self._lock:
            known = self._nodes.get(registration.node_id)
            accepted = known.accepted if known is not None else 0
            self._nodes[registration.node_id] = _Node(registration, self._clock(), accepted)

    def heartbeat(self, node_id: str, heartbeat: NodeHeartbeat) -> bool:
        """Mark the node seen; ``pools`` (when not None) replaces its capabilities' pools.
        False when the node is not registered."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return False
            node.last_seen = self._clock()
            if heartbeat.pools is not None:
                capabilities = node.registration.capabilities.model_copy(update={"pools": list(heartbeat.pools)})
                node.registration = node.registration.model_copy(update={"capabilities": capabilities})
            return True

    def get(self, node_id: str) -> NodeRegistration | None:
        with self._lock:
            node = self._nodes.get(node_id)
            return node.registration if node is not None else None

    def count_accepted(self, node_id: str) -> None:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is not None:
                node.accepted += 1

    def claim_view(self, node_id: str) -> dict[str, Any] | None:
        """What the placement gates see of a node (the "claim node view")."""
        registration = self.get(node_id)
        if registration is None:
            return None
        return {
            "node_id": node_id,
            "sandbox_capable": registration.sandbox_capable,
            "argv_capable": registration.argv_capable,
            "unsandboxed_argv_capable": registration.unsandboxed_argv_capable,
            "module_capable": registration.module_capable,
            "local_datasets": list(registration.local_datasets),
            "capabilities": registration.capabilities.model_dump(mode="json"),
        }

    def views(self, cordons: Cordons, now: datetime) -> list[dict[str, Any]]:
        """``GET /v1alpha1/nodes`` rows, sorted by node id."""
        clock = self._clock()
        with self._lock:
            nodes = sorted(self._nodes.items())
        rows = []
        for node_id, node in nodes:
            registration = node.registration
            age = max(0.0, clock - node.last_seen)
            until, reason = _live_cordon(cordons.get(node_id), now)
            rows.append({
                "node_id": node_id,
                "hostname": registration.hostname,
                "environment": registration.environment.value,
                "argv_capable": registration.argv_capable,
                "module_capable": registration.module_capable,
                "capabilities": registration.capabilities.model_dump(mode="json"),
                "online": age < ONLINE_WINDOW_S,
                "last_heartbeat_age_s": round(age, 3),
                "accepted_tasks": node.accepted,
                "cordoned_until": until,
                "cordon_reason": reason,
            })
        return rows

    def status_counts(self, cordons: Cordons, now: datetime) -> dict[str, int]:
        """Nodes by ``online`` / ``offline``, plus ``cordoned`` (counted besides, not instead)."""
        clock = self._clock()
        with self._lock:
            seen = {node_id: node.last_seen for node_id, node in self._nodes.items()}
        counts = {"online": 0, "offline": 0, "cordoned": 0}
        for node_id, last_seen in seen.items():
            counts["online" if clock - last_seen < ONLINE_WINDOW_S else "offline"] += 1
            if _live_cordon(cordons.get(node_id), now)[1] is not None:
                counts["cordoned"] += 1
        return counts


def _live_cordon(cordon: tuple[datetime | None, str] | None, now: datetime) -> tuple[str | None, str | None]:
    """(ISO until or None, reason) for a cordon in force, (None, None) otherwise."""
    if cordon is None:
        return None, None
    until, reason = cordon
    if until is not None and until <= now:
        return None, None
    return (until.isoformat() if until is not None else None), reason
