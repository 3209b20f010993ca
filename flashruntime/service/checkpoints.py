"""The coordinator's checkpoint request bodies, for agents that register
parts and commit manifests over HTTP. Defined in ``flashruntime.protocol.v1alpha1``
(pydantic only) and re-exported here, so this imports without the ``service`` extra."""

from __future__ import annotations

from flashruntime.protocol.v1alpha1 import CommitRequest, RegisterPartRequest

__all__ = ["CommitRequest", "RegisterPartRequest"]
