"""Who is calling the coordinator: tokens, credentials and identities.

Three roles hold tokens. A *node* token is one machine of the fleet: it claims and
reports work, only on its own leases. A *submitter* token is a person or a script
that submits jobs and reads, cancels and downloads its own. An *operator* token may do
everything, including other submitters' jobs, the node list, cordons and metrics.
Running a command on the fleet is a separate permission, granted by name
(``FLASHML_ARGV_SUBMITTERS``) to submitters and operators alike.

Authenticators map a bearer token to a ``Credential``; the functions below turn a
request's headers into an ``Identity`` and decide each rule, raising ``AuthFailure``
with the HTTP status the app returns unchanged. Tokens are kept only as sha256
digests and compared in constant time. Standard library only, so the policy is
testable without fastapi.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flashruntime.errors import (
    AuthConfigError,
    AuthFailure,
    )
from flashruntime.protocol.base import StrEnum

__all__ = [
    "ARGV_SUBMITTERS_ENV",
    "NODE_TOKENS_ENV",
    "ON_BEHALF_OF_HEADER",
    "OPERATOR_TOKENS_ENV",
    "SUBMITTER_TOKENS_ENV",
    "AuthConfigError",
    "AuthFailure",
    "Credential",
    "Identity",
    "NodeAuthenticator",
    "OpenAuthenticator",
    "Role",
    "StaticTokenAuthenticator",
    "authenticator_from_env",
    "join_code_valid",
    "require_acting_node",
    "require_node",
    "require_operator",
    "require_role",
    "resolve_identity",
    "task_write_allowed",
    "write_allowed",
]

ON_BEHALF_OF_HEADER = "X-FlashML-On-Behalf-Of"
NODE_TOKENS_ENV = "FLASHML_NODE_TOKENS"
OPERATOR_TOKENS_ENV = "FLASHML_OPERATOR_TOKENS"
SUBMITTER_TOKENS_ENV = "FLASHML_SUBMITTER_TOKENS"
ARGV_SUBMITTERS_ENV = "FLASHML_ARGV_SUBMITTERS"
TOKEN_HINT = ("send 'Authorization: Bearer <token>' (the CLI's job commands: --token or FLASHML_TOKEN; "
              "a worker: --token-file, FLASHML_NODE_TOKEN_FILE or FLASHML_NODE_TOKEN)")


class Role(StrEnum):
    """What a token's holder is to the coordinator."""

    NODE = "node"
    SUBMITTER = "submitter"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Credential:
    """What one configured token stands for: its role, its owner's name (the node id of
    a node token) and whether its holder may have commands run on the fleet."""

    role: Role
    name: str
    may_run_code: bool = False


@runtime_checkable
class NodeAuthenticator(Protocol):
    """``enforcing``: whether any rule is checked; ``authenticate``: the node id of a
    node token, else None; ``is_operator``: whether the token is an operator token.

    An authenticator that also knows submitters implements ``credential(token) ->
    Credential | None``; without it, every token is a node or an operator token."""

    @property
    def enforcing(self) -> bool: ...

    def authenticate(self, token: str) -> str | None: ...

    def is_operator(self, token: str) -> bool: ...


class OpenAuthenticator:
    """Not enforcing: authenticates nobody and knows no operators."""

    @property
    def enforcing(self) -> bool:
        return False

    def authenticate(self, token: object) -> str | None:
        return None

    def is_operator(self, token: object) -> bool:
        return False

    def credential(self, token: object) -> Credential | None:
        return None

    def node_ids(self) -> frozenset[str]:
        return frozenset()


def _digest(token: object) -> bytes | None:
    """sha256 of a non-empty ASCII token, else None. Comparing fixed-length digests
    keeps a token's length from leaking through compare_digest's length check."""
    if not isinstance(token, str) or not token or not token.isascii():
        return None
    return hashlib.sha256(token.encode("ascii")).digest()


class StaticTokenAuthenticator:
    """Enforcing: fixed node tokens (``token -> node_id``), operator tokens (``token -> name``)
    and submitter tokens (``token -> name``); ``code_runners`` names the submitters and
    operators whose jobs may run commands on the fleet.

    Every lookup compares the presented token with every configured token, whatever its
    role, without stopping at a match, so timing reveals neither which token matched nor
    its role. Tokens that are not non-empty ASCII strings fail.
    """

    def __init__(
        self,
        tokens: Mapping[str, str],
        operator_tokens: Mapping[str, str] | None = None,
        *,
        submitter_tokens: Mapping[str, str] | None = None,
        code_runners: Iterable[str] = (),
    ) -> None:
        for argument, value, what in (("tokens", tokens, "node_id"), ("operator_tokens", operator_tokens, "name"),
                                      ("submitter_tokens", submitter_tokens, "name")):
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"{argument} must be a mapping of token -> {what}, got {type(value).__name__}")
        if tokens is None:
            raise TypeError("tokens must be a mapping of token -> node_id, got NoneType")
        if isinstance(code_runners, str):
            raise TypeError("code_runners must be a collection of names, not a single string")
        runners = set(code_runners)
        self._candidates: list[tuple[bytes, Credential]] = []
        seen: dict[bytes, Credential] = {}
        for role, mapping in ((Role.NODE, tokens), (Role.OPERATOR, operator_tokens or {}),
                              (Role.SUBMITTER, submitter_tokens or {})):
            for token, owner in mapping.items():
                credential = Credential(role, _owner(owner, role), role is not Role.NODE and owner in runners)
                digest = _configured_digest(token, credential)
                if digest in seen:
                    other = seen[digest]
                    raise AuthConfigError(
                        f"the {role.value} token of {owner!r} is also configured as a {other.role.value} token "
                        f"(of {other.name!r}); give each credential its own token"
                    )
                seen[digest] = credential
                self._candidates.append((digest, credential))
        names = {c.name for _, c in self._candidates if c.role is not Role.NODE}
        unknown = sorted(str(name) for name in runners - names)
        if unknown:
            raise AuthConfigError(
                f"code execution is granted to {', '.join(map(repr, unknown))}, which is no configured submitter "
                f"or operator ({', '.join(sorted(names)) or 'none configured'}); name submitters or operators"
            )

    def credential(self, token: object) -> Credential | None:
        """The credential ``token`` stands for, or None."""
        presented = _digest(token)
        if presented is None:
            return None
        found: Credential | None = None
        for digest, credential in self._candidates:
            # compare_digest runs first on every candidate; no early exit on a match.
            if hmac.compare_digest(digest, presented) and found is None:
                found = credential
        return found

    @property
    def enforcing(self) -> bool:
        return True

    def node_ids(self) -> frozenset[str]:
        """The node ids that hold a node token (what node grants may name)."""
        return frozenset(c.name for _, c in self._candidates if c.role is Role.NODE)

    def authenticate(self, token: object) -> str | None:
        found = self.credential(token)
        return found.name if found is not None and found.role is Role.NODE else None

    def is_operator(self, token: object) -> bool:
        found = self.credential(token)
        return found is not None and found.role is Role.OPERATOR

    def __repr__(self) -> str:  # never the tokens
        counts = {role: sum(1 for _, c in self._candidates if c.role is role) for role in Role}
        return (f"StaticTokenAuthenticator(<{counts[Role.NODE]} node tokens>, <{counts[Role.OPERATOR]} operator "
                f"tokens>, <{counts[Role.SUBMITTER]} submitter tokens>)")


def _owner(owner: object, role: Role) -> str:
    what = "node id" if role is Role.NODE else f"{role.value} name"
    if not isinstance(owner, str) or not owner:
        raise AuthConfigError(f"every token needs a non-empty {what}, got {owner!r}")
    if role is Role.NODE:
        from flashruntime.coordinator.nodes import node_id_problem

        problem = node_id_problem(owner)
        if problem is not None:
            raise AuthConfigError(f"node id {owner!r}: {problem}")
    return owner


def _configured_digest(token: object, credential: Credential) -> bytes:
    what = "node id" if credential.role is Role.NODE else f"{credential.role.value} name"
    if not isinstance(token, str) or not token:
        raise AuthConfigError(
            f"the token of {what} {credential.name!r} is empty or not a string; configure a non-empty token"
        )
    digest = _digest(token)
    if digest is None:
        raise AuthConfigError(f"the token of {what} {credential.name!r} is not ASCII; use ASCII characters only")
    return digest


def _parse_pairs(variable: str, text: str, owner: str) -> list[tuple[str, str, str]]:
    """``"owner:token,..."`` → ``[(token, owner, where)]``; messages name the entry, never the token."""
    pairs: list[tuple[str, str, str]] = []
    for index, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, token = (part.strip() for part in entry.partition(":"))
        where = f"{variable} entry {index}"
        expected = f"expected '{owner}:token,{owner}:token'"
        if not sep:
            raise AuthConfigError(f"{where} has no ':' between {owner} and token; {expected}")
        if not name:
            raise AuthConfigError(f"{where} has an empty {owner}; {expected}")
        where = f"{where} ({owner} {name!r})"
        if not token:
            raise AuthConfigError(f"{where} has an empty token; {expected}")
        if not token.isascii():
            raise AuthConfigError(f"{where} has a token with non-ASCII characters; use ASCII only")
        pairs.append((token, name, where))
    return pairs


def authenticator_from_env(env: Mapping[str, str] | None = None) -> NodeAuthenticator:
    """Build the authenticator from ``FLASHML_NODE_TOKENS``, ``FLASHML_OPERATOR_TOKENS`` and
    ``FLASHML_SUBMITTER_TOKENS`` (each ``"name:token,..."``), granting code execution to
    the submitters and operators named in ``FLASHML_ARGV_SUBMITTERS`` (``"name,..."``).

    A variable that is unset, empty or holds only blanks and commas counts as not set;
    no tokens at all → ``OpenAuthenticator`` (open mode, for development). Any one kind
    of token enforces. A repeated token, a malformed entry, or a code-execution grant
    naming nobody configured (or set in open mode) raises ``AuthConfigError``.
    """
    source = os.environ if env is None else env
    node_pairs = _parse_pairs(NODE_TOKENS_ENV, source.get(NODE_TOKENS_ENV, ""), "node_id")
    operator_pairs = _parse_pairs(OPERATOR_TOKENS_ENV, source.get(OPERATOR_TOKENS_ENV, ""), "name")
    submitter_pairs = _parse_pairs(SUBMITTER_TOKENS_ENV, source.get(SUBMITTER_TOKENS_ENV, ""), "name")
    code_runners = [name.strip() for name in source.get(ARGV_SUBMITTERS_ENV, "").split(",") if name.strip()]
    if not node_pairs and not operator_pairs and not submitter_pairs:
        if code_runners:
            raise AuthConfigError(
                f"{ARGV_SUBMITTERS_ENV} grants code execution but no tokens are configured, so the coordinator "
                f"would be open to everyone; set {SUBMITTER_TOKENS_ENV} or {OPERATOR_TOKENS_ENV} as well"
            )
        return OpenAuthenticator()
    seen: dict[str, str] = {}
    for token, _, where in (*node_pairs, *operator_pairs, *submitter_pairs):
        if token in seen:
            raise AuthConfigError(f"{where} repeats the token of {seen[token]}; every token must be unique")
        seen[token] = where
    try:
        return StaticTokenAuthenticator(
            {token: node_id for token, node_id, _ in node_pairs},
            {token: name for token, name, _ in operator_pairs},
            submitter_tokens={token: name for token, name, _ in submitter_pairs},
            code_runners=code_runners,
        )
    except AuthConfigError as exc:
        if "code execution is granted" in str(exc):
            raise AuthConfigError(f"{ARGV_SUBMITTERS_ENV}: {exc}") from None
        raise


@dataclass(frozen=True)
class Identity:
    """Who acts. ``node_id`` is the acting node: a node token's, or the one an operator
    delegates to (``Identity(<node>, True)``, which acts exactly as that node).
    ``Identity(None, True, name)`` is a header-less operator (unrestricted);
    ``Identity(None, False, name, submitter=True)`` a submitter; ``Identity(None, False)``
    open mode, where nothing is checked. ``may_run_code``: the submitter's or operator's
    jobs may run commands on the fleet."""

    node_id: str | None
    operator: bool
    name: str | None = None
    submitter: bool = False
    may_run_code: bool = False

    @property
    def role(self) -> Role | None:
        """The role the caller acts in; None in open mode."""
        if self.node_id is not None:
            return Role.NODE
        if self.operator:
            return Role.OPERATOR
        if self.submitter:
            return Role.SUBMITTER
        return None


def _bearer(header: str | None) -> str | None:
    if not isinstance(header, str):
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":  # auth schemes are case-insensitive (RFC 9110 §11.1)
        return None
    return token.strip() or None


def _credential(authenticator: NodeAuthenticator, token: str) -> Credential | None:
    lookup = getattr(authenticator, "credential", None)
    if callable(lookup):
        found = lookup(token)
        return found if isinstance(found, Credential) else None
    node_id = authenticator.authenticate(token)  # an authenticator that knows no submitters
    if node_id is not None:
        return Credential(Role.NODE, node_id)
    return Credential(Role.OPERATOR, "operator") if authenticator.is_operator(token) else None


def resolve_identity(
    authenticator: NodeAuthenticator, authorization_header: str | None, on_behalf_of: Sequence[str]
) -> Identity:
    """The caller's identity from ``Authorization`` and every ``X-FlashML-On-Behalf-Of`` value.

    No token → 401; a token nobody holds → 401, the same answer whatever roles exist.
    Node and submitter tokens ignore the delegation header. A comma inside one
    delegation value counts as the header sent twice: that is how a proxy folds
    repeated headers, and node ids cannot hold commas.
    """
    if isinstance(on_behalf_of, str) or not isinstance(on_behalf_of, Sequence):
        raise TypeError(f"on_behalf_of must be the list of every {ON_BEHALF_OF_HEADER} value, not a single string")
    if not all(isinstance(raw, str) for raw in on_behalf_of):
        raise TypeError(f"every {ON_BEHALF_OF_HEADER} value must be a str")
    if not authenticator.enforcing:
        return Identity(None, False)
    token = _bearer(authorization_header)
    if token is None:
        raise AuthFailure(401, f"authentication required: {TOKEN_HINT}")
    credential = _credential(authenticator, token)
    if credential is None:
        raise AuthFailure(401, f"unknown bearer token: {TOKEN_HINT} with a token this coordinator knows")
    if credential.role is Role.NODE:
        return Identity(credential.name, False)
    if credential.role is Role.SUBMITTER:
        return Identity(None, False, credential.name, submitter=True, may_run_code=credential.may_run_code)
    values = [value.strip() for raw in on_behalf_of for value in raw.split(",")]
    if len(values) > 1:
        raise AuthFailure(400, f"{ON_BEHALF_OF_HEADER} sent more than once; send exactly one node id")
    if not values:
        return Identity(None, True, credential.name, may_run_code=credential.may_run_code)
    if not values[0]:
        raise AuthFailure(403, f"{ON_BEHALF_OF_HEADER} is empty; name the node to act as, or omit the header")
    return Identity(values[0], True, credential.name)


def _role_names(roles: Iterable[Role]) -> str:
    names = [role.value for role in Role if role in set(roles)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def require_role(identity: Identity, roles: Iterable[Role], *, enforcing: bool) -> None:
    """The caller must act in one of ``roles`` (when enforcing), else 403 naming them.
    A header-less operator on a route for nodes only gets 401: it must name the node
    it acts as."""
    if not enforcing:
        return
    admitted = frozenset(roles)
    role = identity.role
    if role in admitted:
        return
    if role is None:
        raise AuthFailure(401, f"authentication required: {TOKEN_HINT}")
    if role is Role.OPERATOR and admitted == {Role.NODE}:
        require_acting_node(identity)
    acting = "an operator acting as a node" if identity.operator and role is Role.NODE else f"a {role.value} token"
    raise AuthFailure(
        403, f"this route needs a {_role_names(admitted)} token, and {acting} is not one; set FLASHML_TOKEN "
             "(or --token) to a token of that role"
    )


def require_acting_node(identity: Identity) -> str:
    """The acting node id; a header-less operator (or no identity) → 401."""
    if identity.node_id is None:
        raise AuthFailure(
            401, f"this route needs a node identity: use a node token, or an operator token with {ON_BEHALF_OF_HEADER}"
        )
    return identity.node_id


def require_node(identity: Identity, node_id: str) -> str:
    """The acting node must be ``node_id`` (the path node or a lease's holder), else 403."""
    acting = require_acting_node(identity)
    if acting != node_id:
        raise AuthFailure(403, f"acting node {acting!r} may not act for {node_id!r}")
    return acting


def _well_formed(key: object) -> bool:
    return (isinstance(key, str) and bool(key) and not key.startswith("/") and "\\" not in key
            and ".." not in key.split("/"))


def write_allowed(identity: Identity, key: str, live_pairs: Iterable[tuple[str, str]]) -> bool:
    """Whether ``identity`` may write artifact ``key``: a header-less operator always;
    a node (or delegated operator) only strictly under ``jobs/<job>/<task>/`` of one of
    its live ``(job, task)`` pairs. ``Identity(None, False)`` is refused (fail closed)."""
    if identity.node_id is None:
        return identity.operator
    if not _well_formed(key):
        return False
    for job, task in live_pairs:
        if not job or not task or "/" in job or "/" in task:
            continue
        prefix = f"jobs/{job}/{task}/"
        if key.startswith(prefix) and len(key) > len(prefix):
            return True
    return False


def task_write_allowed(identity: Identity, job_id: str, task_id: str, live_pairs: Iterable[tuple[str, str]]) -> bool:
    """Checkpoint writes: the ``(job, task)`` pair itself must be live for the acting node."""
    if identity.node_id is None:
        return identity.operator
    return (job_id, task_id) in set(live_pairs)


def require_operator(authenticator: NodeAuthenticator, identity: Identity) -> None:
    """Operator-only routes: when enforcing, a header-less operator token is required
    (no token → 401; node or submitter token, or a delegated operator → 403)."""
    if not authenticator.enforcing:
        return
    if identity.operator and identity.node_id is None:
        return
    if identity.role is None:
        raise AuthFailure(401, "authentication required: this route needs an operator token")
    raise AuthFailure(403, f"this route needs an operator token without {ON_BEHALF_OF_HEADER}")


def join_code_valid(expected: str | None, presented: str | None) -> bool:
    """The registration join code check (``X-FlashML-Join-Code``), in constant time.
    No configured code (None) admits every registration; a missing header fails."""
    if expected is None:
        return True
    if not isinstance(presented, str):
        return False
    want = hashlib.sha256(expected.encode("utf-8")).digest()
    got = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
    return hmac.compare_digest(want, got)
