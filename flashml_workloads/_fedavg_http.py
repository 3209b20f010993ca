"""``HttpCoordinator``: the FedAvg driver's view of a coordinator over SPEC §9.2's routes.

Standard library only (``urllib``): 60 s timeout, JSON bodies, the caller's headers (an
operator bearer token, say) on every call. HTTP errors surface as ``urllib.error.HTTPError``
carrying the server's ``detail``, so the driver can retry 5xx and report 4xx; an artifact
GET answered 404 raises ``ArtifactNotFound``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from flashruntime.client import error_detail, quote_key, quote_segment
from flashruntime.errors import ArtifactNotFound

_TIMEOUT_S = 60.0


class HttpCoordinator:
    """A ``Coordinator`` that speaks HTTP to ``flashruntime serve`` (or any server with the same routes)."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"HttpCoordinator: base_url must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})

    def __repr__(self) -> str:  # headers stay out: they usually hold a token
        return f"HttpCoordinator({self.base_url!r})"

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        url = self.base_url + path
        headers = {"Accept": "application/json", **self.headers}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            detail = error_detail(exc)
            raise urllib.error.HTTPError(
                url, exc.code, f"{method} {path} -> {exc.code} {exc.reason}: {detail}", exc.headers, None
            ) from None

    def _json(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        return json.loads(self._request(method, path, body))

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/jobs`` → the ``JobRecord`` (it carries ``job_id``)."""
        return self._json("POST", "/v1alpha1/jobs", body)

    def job_state(self, job_id: str) -> str:
        """``GET /v1alpha1/jobs/{id}`` → its ``state``."""
        return self._json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}")["state"]

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """``GET /v1alpha1/jobs/{id}/artifacts`` → ``[{uri, key, size_bytes}]``."""
        return self._json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/artifacts")

    def tasks(self, job_id: str) -> list[dict[str, Any]]:
        """``GET /v1alpha1/jobs/{id}/tasks`` → ``[{task_id, state, ...}]``."""
        return self._json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/tasks")

    def get_artifact(self, key: str) -> bytes:
        """``GET /v1alpha1/artifacts/{key}`` → the bytes; 404 → ``ArtifactNotFound``."""
        try:
            return self._request("GET", f"/v1alpha1/artifacts/{quote_key(key)}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise ArtifactNotFound(f"artifact {key!r} not found at {self.base_url}") from None
            raise

    def put_artifact(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT /v1alpha1/artifacts/{key}`` with ``body`` as JSON → the ``ArtifactRecord``."""
        return self._json("PUT", f"/v1alpha1/artifacts/{quote_key(key)}", body)
