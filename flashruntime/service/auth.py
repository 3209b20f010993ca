"""Who is calling the coordinator and what they may do (SPEC §9.4).

Authenticators map a bearer token to a node id or to the operator class; the
functions below turn a request's headers into an ``Identity`` and decide each
rule, raising ``AuthFailure`` with the HTTP status the app returns unchanged.
Standard library only, so the policy is testable without fastapi.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flashruntime.errors import AuthConfigError, FlashRuntimeError

__all__ = [
    "ON_BEHALF_OF_HEADER",
    "AuthConfigError",
    "AuthFailure",
    "Identity",
    "NodeAuthenticator",
    "OpenAuthenticator",
    "StaticTokenAuthenticator",
    "authenticator_from_env",
    "join_code_valid",
    "require_acting_node",
    "require_node",
    "require_operator",
    "resolve_identity",
    "task_write_allowed",
    "write_allowed",
]

ON_BEHALF_OF_HEADER = "X-FlashML-On-Behalf-Of"
_NODE_ENV = "FLASHML_NODE_TOKENS"
_OPERATOR_ENV = "FLASHML_OPERATOR_TOKENS"


@runtime_checkable
class NodeAuthenticator(Protocol):
    """``enforcing``: whether any rule is checked; ``authenticate``: the node id of a
    node token, else None; ``is_operator``: whether the token is an operator token."""

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


def _digest(token: object) -> bytes | None:
    """sha256 of a non-empty ASCII token, else None. Comparing fixed-length digests
    keeps a token's length from leaking through compare_digest's length check."""
    if not isinstance(token, str) or not token or not token.isascii():
        return None
    return hashlib.sha256(token.encode("ascii")).digest()


class StaticTokenAuthenticator:
    """Enforcing: fixed node tokens (``token -> node_id``) and operator tokens (``token -> name``).

    Every lookup compares the presented token with every configured token, node and
    operator alike, without stopping at a match, so timing reveals neither which
    token matched nor its class. Tokens that are not non-empty ASCII strings fail.
    """

    def __init__(self, tokens: Mapping[str, str], operator_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(tokens, Mapping):
            raise TypeError(f"tokens must be a mapping of token -> node_id, got {type(tokens).__name__}")
        if operator_tokens is not None and not isinstance(operator_tokens, Mapping):
            raise TypeError(
                f"operator_tokens must be a mapping of token -> name or None, got {type(operator_tokens).__name__}"
            )
        self._candidates: list[tuple[bytes, str, bool]] = []  # (digest, node id or name, is operator)
        for token, node_id in tokens.items():
            self._add(token, node_id, operator=False)
        node_digests = {digest for digest, _, _ in self._candidates}
        for token, name in (operator_tokens or {}).items():
            digest = self._add(token, name, operator=True)
            if digest in node_digests:
                raise AuthConfigError(
                    f"operator token for {name!r} is also configured as a node token; give each credential "
                    "its own token"
                )
        self._node_count = len(node_digests)

    def _add(self, token: object, owner: object, *, operator: bool) -> bytes:
        what = "operator name" if operator else "node id"
        if not isinstance(owner, str) or not owner:
            raise AuthConfigError(f"every token needs a non-empty {what}, got {owner!r}")
        if not isinstance(token, str) or not token:
            raise AuthConfigError(f"the token of {what} {owner!r} is empty or not a string; configure a non-empty token")
        digest = _digest(token)
        if digest is None:
            raise AuthConfigError(f"the token of {what} {owner!r} is not ASCII; use ASCII characters only")
        self._candidates.append((digest, owner, operator))
        return digest

    def _match(self, token: object) -> tuple[str, bool] | None:
        presented = _digest(token)
        if presented is None:
            return None
        found: tuple[str, bool] | None = None
        for digest, owner, operator in self._candidates:
            # compare_digest runs first on every candidate; no early exit on a match.
            if hmac.compare_digest(digest, presented) and found is None:
                found = (owner, operator)
        return found

    @property
    def enforcing(self) -> bool:
        return True

    def authenticate(self, token: object) -> str | None:
        found = self._match(token)
        return found[0] if found is not None and not found[1] else None

    def is_operator(self, token: object) -> bool:
        found = self._match(token)
        return found is not None and found[1]

    def __repr__(self) -> str:  # never the tokens
        operators = len(self._candidates) - self._node_count
        return f"StaticTokenAuthenticator(<{self._node_count} node tokens>, <{operators} operator tokens>)"


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
    """Build the authenticator from ``FLASHML_NODE_TOKENS`` / ``FLASHML_OPERATOR_TOKENS``.

    A variable that is unset, empty or holds only blanks and commas counts as not
    set; neither set → ``OpenAuthenticator``. Operator tokens alone still enforce.
    """
    source = os.environ if env is None else env
    node_pairs = _parse_pairs(_NODE_ENV, source.get(_NODE_ENV, ""), "node_id")
    operator_pairs = _parse_pairs(_OPERATOR_ENV, source.get(_OPERATOR_ENV, ""), "name")
    if not node_pairs and not operator_pairs:
        return OpenAuthenticator()
    seen: dict[str, str] = {}
    for token, _, where in (*node_pairs, *operator_pairs):
        if token in seen:
            raise AuthConfigError(f"{where} repeats the token of {seen[token]}; every token must be unique")
        seen[token] = where
    return StaticTokenAuthenticator(
        {token: node_id for token, node_id, _ in node_pairs},
        {token: name for token, name, _ in operator_pairs},
    )


class AuthFailure(FlashRuntimeError):
    """A request refused by the auth policy; the app answers ``status_code`` with ``detail``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail

    @property
    def headers(self) -> dict[str, str]:
        """Response headers: a 401 names the expected scheme (RFC 6750)."""
        return {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else {}


@dataclass(frozen=True)
class Identity:
    """Who acts: ``node_id`` is the acting node, or None for a header-less operator
    (unrestricted) or when not enforcing (``Identity(None, False)``, nothing checked).
    A delegated operator is ``Identity(<node>, True)`` and acts exactly as that node."""

    node_id: str | None
    operator: bool


def _bearer(header: str | None) -> str | None:
    if not isinstance(header, str):
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":  # auth schemes are case-insensitive (RFC 9110 §11.1)
        return None
    return token.strip() or None


def resolve_identity(
    authenticator: NodeAuthenticator, authorization_header: str | None, on_behalf_of: Sequence[str]
) -> Identity:
    """The caller's identity from ``Authorization`` and every ``X-FlashML-On-Behalf-Of`` value.

    A comma inside one delegation value counts as the header sent twice: that is how a
    proxy folds repeated headers, and node ids from the environment cannot hold commas.
    """
    if isinstance(on_behalf_of, str) or not isinstance(on_behalf_of, Sequence):
        raise TypeError(f"on_behalf_of must be the list of every {ON_BEHALF_OF_HEADER} value, not a single string")
    if not all(isinstance(raw, str) for raw in on_behalf_of):
        raise TypeError(f"every {ON_BEHALF_OF_HEADER} value must be a str")
    if not authenticator.enforcing:
        return Identity(None, False)
    token = _bearer(authorization_header)
    if token is None:
        raise AuthFailure(401, "authentication required: send 'Authorization: Bearer <token>'")
    node_id = authenticator.authenticate(token)
    operator = authenticator.is_operator(token)
    if node_id is not None:
        return Identity(node_id, False)  # node tokens ignore the delegation header
    if not operator:
        raise AuthFailure(401, "unknown bearer token")
    values = [value.strip() for raw in on_behalf_of for value in raw.split(",")]
    if len(values) > 1:
        raise AuthFailure(400, f"{ON_BEHALF_OF_HEADER} sent more than once; send exactly one node id")
    if not values:
        return Identity(None, True)
    if not values[0]:
        raise AuthFailure(403, f"{ON_BEHALF_OF_HEADER} is empty; name the node to act as, or omit the header")
    return Identity(values[0], True)


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
    (no token → 401; node token or delegated operator → 403)."""
    if not authenticator.enforcing:
        return
    if identity.operator and identity.node_id is None:
        return
    if not identity.operator and identity.node_id is None:
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
