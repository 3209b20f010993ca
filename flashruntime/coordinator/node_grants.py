"""What a node's credential lets it serve: the team pools it may claim from, and whether it
may run argv without a sandbox.

A node states its pools and its unsandboxed runner when it registers, and states pools again
in heartbeats; both are claims. The operator grants them per node token
(``FLASHML_NODE_POOLS``, ``FLASHML_UNSANDBOXED_NODES``) and, for nodes that register with the
join code alone, to the join code (``FLASHML_JOIN_CODE_POOLS``,
``FLASHML_JOIN_CODE_UNSANDBOXED``). What a node states is intersected with its grant before
it is stored, so placement only ever sees granted capabilities. A credential with nothing
granted gets nothing; a coordinator without tokens or join code keeps what nodes state, as
a development setup expects.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from flashruntime.errors import AuthConfigError

__all__ = [
    "JOIN_CODE_POOLS_ENV",
    "JOIN_CODE_UNSANDBOXED_ENV",
    "NODE_POOLS_ENV",
    "UNSANDBOXED_NODES_ENV",
    "Granted",
    "NodeGrant",
    "NodeGrants",
    "grant_statement",
    "node_grants_for",
    "node_grants_from_env",
]

NODE_POOLS_ENV = "FLASHML_NODE_POOLS"
UNSANDBOXED_NODES_ENV = "FLASHML_UNSANDBOXED_NODES"
JOIN_CODE_POOLS_ENV = "FLASHML_JOIN_CODE_POOLS"
JOIN_CODE_UNSANDBOXED_ENV = "FLASHML_JOIN_CODE_UNSANDBOXED"
# Pools are separated by '|' inside an entry and entries by ',', and ':' ends a node id, so a
# pool name holds none of those; a hostname-like word also reads well in logs and the node list.
_POOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
_NODE_POOLS_FORM = "expected 'node_id:pool|pool,node_id:pool', e.g. 'node-a:finance-team|ml,node-b:ml'"


@dataclass(frozen=True)
class NodeGrant:
    """The pools a credential may serve and whether it may run argv unsandboxed."""

    pools: frozenset[str] = frozenset()
    unsandboxed_argv: bool = False


@dataclass(frozen=True)
class Granted:
    """A node's statement cut to its grant: what is kept, and what was withheld."""

    pools: list[str]
    unsandboxed_argv: bool
    withheld_pools: list[str]
    withheld_unsandboxed_argv: bool

    @property
    def withheld(self) -> bool:
        return bool(self.withheld_pools) or self.withheld_unsandboxed_argv


def grant_statement(pools: Iterable[str], unsandboxed_argv: bool, grant: NodeGrant | None) -> Granted:
    """The stated ``pools`` and unsandboxed runner, intersected with ``grant`` (None: no
    grant applies, everything stated is kept)."""
    stated = list(pools)
    if grant is None:
        return Granted(stated, unsandboxed_argv, [], False)
    kept = [pool for pool in stated if pool in grant.pools]
    withheld = [pool for pool in stated if pool not in grant.pools]
    return Granted(kept, unsandboxed_argv and grant.unsandboxed_argv, withheld,
                   unsandboxed_argv and not grant.unsandboxed_argv)


@dataclass(frozen=True)
class NodeGrants:
    """Every configured grant. ``enforcing``: node tokens decide (a node id without an entry
    is granted nothing); otherwise ``join_code`` is the grant of every registration when a
    join code is configured, and None (nothing checked) when none is."""

    by_node: Mapping[str, NodeGrant]
    join_code: NodeGrant | None
    enforcing: bool

    def for_node(self, node_id: str) -> NodeGrant | None:
        """The grant that bounds ``node_id``'s statements; None when nothing bounds them."""
        if self.enforcing:
            return self.by_node.get(node_id, NodeGrant())
        return self.join_code

    def describe_withheld(self, node_id: str, granted: Granted) -> str:
        """One sentence on what was withheld from ``node_id``, why, and how to grant it."""
        parts = []
        if granted.withheld_pools:
            parts.append(f"pools {', '.join(granted.withheld_pools)}")
        if granted.withheld_unsandboxed_argv:
            parts.append("commands beyond the sandbox (argv_capable or unsandboxed_argv_capable)")
        if self.enforcing:
            fix = (f"grant them to its token in {NODE_POOLS_ENV} ('{node_id}:pool|pool') and "
                   f"{UNSANDBOXED_NODES_ENV} ('{node_id}')")
        else:
            fix = f"grant them to the join code in {JOIN_CODE_POOLS_ENV} and {JOIN_CODE_UNSANDBOXED_ENV}=1"
        return (f"node {node_id!r} stated {' and '.join(parts)}, which its credential was not granted, so no task "
                f"needing them is placed there; {fix} on the coordinator")


def _pool_problem(pool: str) -> str | None:
    if not _POOL.fullmatch(pool):
        return (f"pool {pool!r} is not a pool name (letters, digits and '.', '_', '@', '+', '-', starting with a "
                "letter or digit)")
    return None


def _parse_node_pools(text: str, node_ids: Collection[str]) -> dict[str, frozenset[str]]:
    grants: dict[str, frozenset[str]] = {}
    for index, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        if not entry:
            continue
        node_id, sep, pools_text = (part.strip() for part in entry.partition(":"))
        where = f"{NODE_POOLS_ENV} entry {index}"
        if not sep or not node_id:
            raise AuthConfigError(f"{where} ({entry!r}) has no node id before ':'; {_NODE_POOLS_FORM}")
        where = f"{where} (node {node_id!r})"
        if node_id not in node_ids:
            raise AuthConfigError(f"{where} names a node with no token in FLASHML_NODE_TOKENS; give it a token "
                                  "there, or remove the entry")
        if node_id in grants:
            raise AuthConfigError(f"{where} repeats a node; list all of its pools in one entry, separated by '|'")
        pools = [pool.strip() for pool in pools_text.split("|")]
        if not any(pools):
            raise AuthConfigError(f"{where} grants no pool; {_NODE_POOLS_FORM}")
        for pool in pools:
            problem = _pool_problem(pool)
            if problem is not None:
                raise AuthConfigError(f"{where}: {problem}; {_NODE_POOLS_FORM}")
        grants[node_id] = frozenset(pools)
    return grants


def _parse_names(variable: str, text: str, node_ids: Collection[str]) -> frozenset[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(node_ids))
    if unknown:
        raise AuthConfigError(f"{variable} names {', '.join(map(repr, unknown))}, which has no token in "
                              "FLASHML_NODE_TOKENS; list node ids that have one (e.g. 'node-a,node-b')")
    return frozenset(names)


def _parse_pool_list(variable: str, text: str) -> frozenset[str]:
    pools = [pool.strip() for pool in text.split("|") if pool.strip()]
    for pool in pools:
        problem = _pool_problem(pool)
        if problem is not None:
            raise AuthConfigError(f"{variable}: {problem}; expected 'pool|pool', e.g. 'ml|cpu'")
    return frozenset(pools)


def _flag(variable: str, text: str) -> bool:
    value = text.strip()
    if value not in ("", "0", "1"):
        raise AuthConfigError(f"{variable} is {text!r}; set it to 1 (granted) or 0 (not granted)")
    return value == "1"


def node_grants_from_env(
    env: Mapping[str, str], *, node_ids: Collection[str], enforcing: bool, join_code_set: bool
) -> NodeGrants:
    """The grants configured in ``env``. ``node_ids``: the ids that hold node tokens;
    ``enforcing``: whether any token is configured; ``join_code_set``: whether a join code is.

    ``FLASHML_NODE_POOLS="node_id:pool|pool,..."`` and ``FLASHML_UNSANDBOXED_NODES="node_id,..."``
    grant node tokens; ``FLASHML_JOIN_CODE_POOLS="pool|pool"`` and
    ``FLASHML_JOIN_CODE_UNSANDBOXED=1`` grant registrations by join code, which decide only
    where no tokens are configured. A grant naming a node without a token, or given to a
    join code that is not configured or does not decide, is an ``AuthConfigError``: it would
    silently grant nothing."""
    by_node_pools = _parse_node_pools(env.get(NODE_POOLS_ENV, ""), node_ids)
    unsandboxed = _parse_names(UNSANDBOXED_NODES_ENV, env.get(UNSANDBOXED_NODES_ENV, ""), node_ids)
    join_pools = _parse_pool_list(JOIN_CODE_POOLS_ENV, env.get(JOIN_CODE_POOLS_ENV, ""))
    join_unsandboxed = _flag(JOIN_CODE_UNSANDBOXED_ENV, env.get(JOIN_CODE_UNSANDBOXED_ENV, ""))
    if join_pools or join_unsandboxed:
        given = JOIN_CODE_POOLS_ENV if join_pools else JOIN_CODE_UNSANDBOXED_ENV
        if enforcing:
            raise AuthConfigError(
                f"{given} grants registrations by join code, but tokens are configured, so every node registers "
                f"with its node token and that token's grant decides; grant pools in {NODE_POOLS_ENV} and "
                f"unsandboxed argv in {UNSANDBOXED_NODES_ENV}, and unset {given}")
        if not join_code_set:
            raise AuthConfigError(
                f"{given} grants registrations by join code, but no join code is configured; set "
                f"FLASHML_JOIN_CODE, or unset {given}")
    by_node = {node_id: NodeGrant(by_node_pools.get(node_id, frozenset()), node_id in unsandboxed)
               for node_id in set(by_node_pools) | set(unsandboxed)}
    join_grant = NodeGrant(join_pools, join_unsandboxed) if join_code_set else None
    return NodeGrants(by_node, join_grant, enforcing)


def node_grants_for(authenticator: object, *, join_code_set: bool, env: Mapping[str, str] | None = None) -> NodeGrants:
    """``node_grants_from_env`` for the coordinator's authenticator (``os.environ`` by default)."""
    node_ids = getattr(authenticator, "node_ids", None)
    return node_grants_from_env(
        os.environ if env is None else env,
        node_ids=node_ids() if callable(node_ids) else (),
        enforcing=bool(getattr(authenticator, "enforcing", False)),
        join_code_set=join_code_set,
    )
