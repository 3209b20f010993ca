"""What the OpenAPI schema says beyond the routes' own models: the error body of every
refusal, the bearer security scheme, and each operation's roles from ``ROUTE_ACCESS``."""

from __future__ import annotations

from typing import Any

from flashruntime.coordinator.access import ROUTE_ACCESS
from flashruntime.protocol.api_v1alpha1 import ErrorBody

__all__ = ["BYTES_RESPONSE", "ERRORS", "SECURITY_SCHEME", "add_security"]

SECURITY_SCHEME = "bearer"

# Every refusal carries {"detail": ...}: a sentence, or the list of a body's problems (422).
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "refused; `detail` says why and what to send instead"},
}
BYTES_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
          "description": "the artifact's bytes"},
}


def add_security(schema: dict[str, Any], *, metrics_public: bool = False) -> dict[str, Any]:
    """``schema`` with the bearer scheme declared and, on each operation, the roles that
    may call it (``x-flashml-roles``) and whether a token is needed (``security``)."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http", "scheme": "bearer",
        "description": "a node, submitter or operator token (open mode: none needed)",
    }
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            access = ROUTE_ACCESS.get((method.upper(), path))
            if access is None or not isinstance(operation, dict):
                continue
            roles = sorted(role.value for role in access.roles)
            is_open = access.open or (metrics_public and (method.upper(), path) == ("GET", "/metrics"))
            operation["security"] = [] if is_open else [{SECURITY_SCHEME: []}]
            operation["x-flashml-roles"] = [] if is_open else roles
            rule = "open to everyone" if is_open else f"roles: {', '.join(roles)}"
            if access.scope:
                rule = f"{rule}; {access.scope}"
            description = operation.get("description", "")
            operation["description"] = f"{description}\n\nAccess: {rule}.".strip()
    return schema
