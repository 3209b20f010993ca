"""What the FedAvg and K-means drivers need of a coordinator: the ``Coordinator`` Protocol,
``HttpCoordinator`` (it over HTTP through ``flashruntime.client``, standard library only)
and ``artifact_json``, how a driver reads an artifact whichever form ``get_artifact`` returns.

HTTP errors surface as ``CoordinatorHTTPError`` carrying the status and the server's
``detail`` (a missing artifact as ``ArtifactNotFound``), a coordinator that cannot be
reached as ``CoordinatorUnavailable``. The client tries each call once: the drivers
decide what to retry, by the same rule (``flashruntime.client.RetryPolicy``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import flashruntime
from flashruntime.client import NO_RETRY, CoordinatorClient

__all__ = ["Coordinator", "HttpCoordinator", "artifact_json"]

_TIMEOUT_S = 60.0


class Coordinator(Protocol):
    """What the drivers need from a coordinator. An optional ``tasks(job_id)`` is probed with ``getattr``.

    ``get_artifact(key)`` returns the artifact's bytes (or its text as ``str``), as
    ``HttpCoordinator`` does, or the already parsed JSON value (a ``dict`` or ``list``), as
    many user-written coordinators do; the drivers read all three alike (``artifact_json``).
    A missing artifact raises ``ArtifactNotFound``.
    """

    def submit(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def job_state(self, job_id: str) -> str: ...

    def artifacts(self, job_id: str) -> list[dict[str, Any]]: ...

    def get_artifact(self, key: str) -> bytes | str | dict[str, Any] | list[Any]: ...

    def put_artifact(self, key: str, body: dict[str, Any]) -> dict[str, Any]: ...


def artifact_json(raw: Any, key: str) -> Any:
    """The JSON value of artifact ``key`` as ``get_artifact`` returned it: a ``dict`` or ``list``
    is already parsed and returned as it is; ``bytes`` or ``str`` is parsed (``ValueError``
    naming ``key`` when it is not JSON); anything else is a ``TypeError`` naming the forms."""
    if isinstance(raw, (dict, list)):
        return raw
    if isinstance(raw, (bytes, bytearray, str)):
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{key} is not valid JSON ({exc})") from None
    raise TypeError(
        f"get_artifact({key!r}) returned {type(raw).__name__}; a coordinator's get_artifact returns the "
        "artifact's bytes or text, or its parsed JSON (a dict or list)"
    )


class HttpCoordinator:
    """A ``Coordinator`` that speaks HTTP to ``flashruntime serve`` (or any server with the same
    routes). ``headers`` go with every call: ``{"Authorization": "Bearer <token>"}`` on a
    coordinator with tokens (a submitter's token for its own jobs, or an operator's)."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"HttpCoordinator: base_url must be an http(s) URL, got {base_url!r}")
        self.headers = dict(headers or {})
        self.client = CoordinatorClient(base_url, headers=self.headers, timeout_s=_TIMEOUT_S, retry=NO_RETRY,
                                        user_agent=f"flashruntime-driver/{flashruntime.__version__}")
        self.base_url = self.client.base_url

    def __repr__(self) -> str:  # headers stay out: they usually hold a token
        return f"HttpCoordinator({self.base_url!r})"

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/jobs`` → the ``JobRecord`` (it carries ``job_id``)."""
        return self.client.submit_job(body)

    def job_state(self, job_id: str) -> str:
        """``GET /v1alpha1/jobs/{id}`` → its ``state``."""
        return self.client.job_state(job_id)

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """``GET /v1alpha1/jobs/{id}/artifacts`` → ``[{uri, key, size_bytes}]``."""
        return self.client.job_artifacts(job_id)

    def tasks(self, job_id: str) -> list[dict[str, Any]]:
        """``GET /v1alpha1/jobs/{id}/tasks`` → ``[{task_id, state, ...}]``."""
        return self.client.tasks(job_id)

    def get_artifact(self, key: str) -> bytes:
        """``GET /v1alpha1/artifacts/{key}`` → the bytes; 404 → ``ArtifactNotFound``."""
        return self.client.get_artifact(key)

    def put_artifact(self, key: str, body: Any) -> dict[str, Any]:
        """``PUT /v1alpha1/artifacts/{key}`` with ``body`` as JSON → the ``ArtifactRecord``."""
        return self.client.put_json_artifact(key, body)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> dict[str, Any]:
        """``PUT /v1alpha1/artifacts/{key}`` with ``data`` as the body → the ``ArtifactRecord``."""
        return self.client.put_artifact(key, data, content_type)
