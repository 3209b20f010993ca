"""The coordinator's node registry: registrations and heartbeats in a ``NodeStore``, and
the rule for node ids.

Registrations, accepted counts and the last heartbeat are stored, so a restarted
coordinator still knows every node (it may heartbeat and claim without registering
again), and every replica sharing the database sees a node heard by any of them. A node
is online while its last heartbeat, heard here or stored by any replica, is recent. The
clock is injected so tests can age nodes.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from flashruntime.coordinator.node_grants import Granted, NodeGrant, grant_statement
from flashruntime.coordinator.node_store import InMemoryNodeStore, NodeStore
from flashruntime.protocol.v1alpha1 import NodeHeartbeat, NodeRegistration

__all__ = ["MAX_NODE_ID_LENGTH", "ONLINE_WINDOW_S", "NodeRegistry", "node_id_problem"]

ONLINE_WINDOW_S = 15.0  # a node is online if it registered or heartbeated this recently
# A heartbeat is written to the store only when the stored one is this much older: a fleet's
# heartbeats (every 5 s from the agent) cost one write per node per interval instead of one
# each, and a replica that did not hear a node sees it at most this much older than it is,
# well inside the online window.
SEEN_WRITE_INTERVAL_S = ONLINE_WINDOW_S / 3
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


class NodeRegistry:
    """Registered nodes by id, over a ``NodeStore`` (default: in memory); thread-safe."""

    def __init__(self, store: NodeStore | None = None, clock: Callable[[], float] = time.time) -> None:
        self._store: NodeStore = store if store is not None else InMemoryNodeStore()
        self._clock = clock
        self._lock = threading.Lock()
        self._heard: dict[str, float] = {}  # node id -> when this process last heard from it

    @property
    def store(self) -> NodeStore:
        return self._store

    def register(self, registration: NodeRegistration, grant: NodeGrant | None = None) -> Granted:
        """Store (or replace) a registration, its pools and unsandboxed runner cut to ``grant``
        (None: kept as stated); a re-registration keeps the accepted count. What was cut is
        in the answer."""
        granted = grant_statement(registration.capabilities.pools, _runs_any_command(registration), grant)
        if granted.withheld:
            registration = registration.model_copy(update={
                "capabilities": registration.capabilities.model_copy(update={"pools": granted.pools}),
                "unsandboxed_argv_capable": registration.unsandboxed_argv_capable and granted.unsandboxed_argv,
                "argv_capable": registration.argv_capable and granted.unsandboxed_argv,
            })
        now = self._clock()
        self._store.register(registration, now)
        with self._lock:
            self._heard[registration.node_id] = now
        return granted

    def heartbeat(self, node_id: str, heartbeat: NodeHeartbeat, grant: NodeGrant | None = None) -> bool:
        """Mark the node seen; ``pools`` (when not None) replaces its capabilities' pools, cut
        to ``grant`` as at registration. False when the node is not registered."""
        stored = self._store.get(node_id)
        if stored is None:
            return False
        now = self._clock()
        if heartbeat.pools is not None:
            pools = grant_statement(heartbeat.pools, False, grant).pools
            if pools != stored.registration.capabilities.pools:
                self._store.set_pools(node_id, pools)
        if now - stored.last_seen >= SEEN_WRITE_INTERVAL_S:
            self._store.seen(node_id, now)
        with self._lock:
            self._heard[node_id] = now
        return True

    def get(self, node_id: str) -> NodeRegistration | None:
        stored = self._store.get(node_id)
        return stored.registration if stored is not None else None

    def count_accepted(self, node_id: str) -> None:
        self._store.count_accepted(node_id)

    def claim_view(self, node_id: str, grant: NodeGrant | None = None) -> dict[str, Any] | None:
        """What the placement gates see of a node (the "claim node view"): its stored
        registration, never what a claim says, cut to ``grant`` once more so a grant the
        operator withdrew since the node registered is withdrawn from its next claim."""
        registration = self.get(node_id)
        if registration is None:
            return None
        granted = grant_statement(registration.capabilities.pools, _runs_any_command(registration), grant)
        capabilities = registration.capabilities.model_dump(mode="json")
        capabilities["pools"] = granted.pools
        return {
            "node_id": node_id,
            "sandbox_capable": registration.sandbox_capable,
            "argv_capable": registration.argv_capable and granted.unsandboxed_argv,
            "unsandboxed_argv_capable": registration.unsandboxed_argv_capable and granted.unsandboxed_argv,
            "module_capable": registration.module_capable,
            "local_datasets": list(registration.local_datasets),
            "capabilities": capabilities,
        }

    def _ages(self, nodes: list[Any]) -> dict[str, tuple[float, bool]]:
        """``node id -> (seconds since last heard of, online)``: the later of what this process
        heard and what the store holds (another replica's, or an earlier process's, heartbeat)."""
        clock = self._clock()
        with self._lock:
            heard = dict(self._heard)
        ages = {}
        for node in nodes:
            node_id = node.registration.node_id
            here = heard.get(node_id)
            last = node.last_seen if here is None else max(here, node.last_seen)
            age = max(0.0, clock - last)
            ages[node_id] = (age, age < ONLINE_WINDOW_S)
        return ages

    def views(self, cordons: Cordons, now: datetime) -> list[dict[str, Any]]:
        """``GET /v1alpha1/nodes`` rows, sorted by node id."""
        nodes = self._store.all()
        ages = self._ages(nodes)
        rows = []
        for node in nodes:
            registration = node.registration
            node_id = registration.node_id
            age, online = ages[node_id]
            until, reason = _live_cordon(cordons.get(node_id), now)
            rows.append({
                "node_id": node_id,
                "hostname": registration.hostname,
                "environment": registration.environment.value,
                "argv_capable": registration.argv_capable,
                "module_capable": registration.module_capable,
                "capabilities": registration.capabilities.model_dump(mode="json"),
                "online": online,
                "last_heartbeat_age_s": round(age, 3),
                "accepted_tasks": node.accepted,
                "cordoned_until": until,
                "cordon_reason": reason,
            })
        return rows

    def status_counts(self, cordons: Cordons, now: datetime) -> dict[str, int]:
        """Nodes by ``online`` / ``offline``, plus ``cordoned`` (counted besides, not instead)."""
        ages = self._ages(self._store.all())
        counts = {"online": 0, "offline": 0, "cordoned": 0}
        for node_id, (_, online) in ages.items():
            counts["online" if online else "offline"] += 1
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


def _runs_any_command(registration: NodeRegistration) -> bool:
    """Whether a node states it runs commands of any tier: itself (``unsandboxed_argv_capable``)
    or in containers of its own (``argv_capable``). Either is granted by the unsandboxed grant:
    a sandboxed-tier command is the only kind a node without it is given."""
    return registration.unsandboxed_argv_capable or registration.argv_capable
