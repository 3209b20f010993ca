"""What the OpenAPI schema says beyond the routes' own models: the error body of every
refusal, the bearer security scheme, each operation's roles from ``ROUTE_ACCESS``, and
(``add_value_rules``) the rules the models' validators apply that their JSON Schema
cannot say by itself, so a body the schema allows is a body the coordinator accepts."""

from __future__ import annotations

from typing import Any

from flashruntime.coordinator.access import ROUTE_ACCESS
from flashruntime.coordinator.checkpoint_paths import PART_KEY_PATTERN, STORAGE_PREFIX_PATTERN
from flashruntime.protocol.api_v1alpha1 import ErrorBody

__all__ = ["BYTES_RESPONSE", "ERRORS", "SECURITY_SCHEME", "VALUE_RULES", "add_security", "add_value_rules"]

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


_DNS1123_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a job's name, as JobMetadata's validator takes it
_INT64_MAX = 2**63 - 1  # the checkpoint registry's integers are SQLite's (and PostgreSQL's BIGINT)
# {component: {property: extra JSON Schema}}: what each model's validators (and the stores
# behind them) refuse.
VALUE_RULES: dict[str, dict[str, dict[str, Any]]] = {
    "JobMetadata": {"name": {"pattern": _DNS1123_LABEL, "maxLength": 63}},
    "ImageSpec": {"tag": {"minLength": 1, "not": {"const": "latest"}}},
    "ArtifactsSpec": {"outputPrefix": {"pattern": "^artifact://"}},
    "CommitRequest": {"storage_prefix": {"pattern": STORAGE_PREFIX_PATTERN}, "step": {"maximum": _INT64_MAX}},
    "RegisterPartRequest": {"step": {"maximum": _INT64_MAX}},
}
# Checkpoint parts sent to be registered name a path relative to the task's checkpoints; the
# manifests the coordinator answers with keep the part schema as it is.
_PART_TO_REGISTER = {"allOf": [{"$ref": "#/components/schemas/CheckpointPart"},
                               {"properties": {"key": {"pattern": PART_KEY_PATTERN},
                                               "size_bytes": {"maximum": _INT64_MAX}}}]}
# A cordon has a length or an end, not both.
_ONE_DURATION = {"not": {"required": ["seconds", "until"],
                         "properties": {"seconds": {"type": "number"}, "until": {"type": "string"}}}}


def add_value_rules(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``VALUE_RULES`` and the request-only rules (checkpoint part keys, a
    cordon's one duration, an artifact's non-empty body) written into it."""
    components = schema.get("components", {}).get("schemas", {})
    for name, properties in VALUE_RULES.items():
        model = components.get(name, {}).get("properties", {})
        for field, rule in properties.items():
            if field in model:
                model[field].update(rule)
    register = components.get("RegisterPartRequest", {}).get("properties", {})
    if "part" in register:
        register["part"] = {**_PART_TO_REGISTER, "title": register["part"].get("title", "Part")}
    commit = components.get("CommitRequest", {}).get("properties", {})
    if "expected_parts" in commit:
        commit["expected_parts"]["items"] = dict(_PART_TO_REGISTER)
    if "CordonRequest" in components:
        components["CordonRequest"].update(_ONE_DURATION)
    upload = schema.get("paths", {}).get("/v1alpha1/artifacts/{key}", {}).get("put", {})
    for content in upload.get("requestBody", {}).get("content", {}).values():
        content.get("schema", {})["minLength"] = 1
    return schema
