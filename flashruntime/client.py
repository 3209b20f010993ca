"""Talking to a coordinator over HTTP, with the standard library only (``urllib``).

The pieces every client needs (path quoting, an error response's detail, which
failures are worth retrying) and ``WorkerClient``, an agent's view of the node, lease
and artifact routes. Every call carries ``Authorization: Bearer <token>`` when a token
is given; registration also carries the join code. An HTTP error status becomes
``CoordinatorHTTPError`` (with ``status`` and the server's ``detail``); a connection
failure becomes ``CoordinatorUnavailable``, so callers branch on types, not on urllib.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import flashruntime
from flashruntime.errors import CoordinatorUnavailable, FlashRuntimeError

_DETAIL_CHARS = 500


def quote_segment(value: object) -> str:
    """One path segment (a job, node or lease id): every ``/`` is escaped."""
    return urllib.parse.quote(str(value), safe="")


def quote_key(key: str) -> str:
    """An artifact key, whose ``/`` separators stay: ``/v1alpha1/artifacts/{key:path}``."""
    return urllib.parse.quote(key, safe="/")


def error_detail(exc: urllib.error.HTTPError) -> str:
    """FastAPI's ``{"detail": ...}`` of an error response, else its text (capped), else the reason."""
    try:
        raw = exc.read()
    except (OSError, http.client.HTTPException):
        return exc.reason if isinstance(exc.reason, str) else ""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:_DETAIL_CHARS]
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:_DETAIL_CHARS]
    return str(parsed)[:_DETAIL_CHARS]


def is_transient(exc: BaseException) -> bool:
    """Connection errors, HTTP 5xx and 429 (the coordinator's rate limit) are worth retrying;
    other 4xx and everything else is not."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException))


JOIN_CODE_HEADER = "X-FlashML-Join-Code"
DEFAULT_TIMEOUT_S = 60.0
_CHUNK = 1024 * 1024
_USER_AGENT = f"flashruntime-worker/{flashruntime.__version__}"


class CoordinatorHTTPError(FlashRuntimeError):
    """The coordinator answered with an HTTP error status (``status``; ``detail`` from its body)."""

    def __init__(self, method: str, path: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {detail}")
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail


class WorkerClient:
    """One agent's view of a coordinator: register, heartbeats, claim, complete/fail, artifacts."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        join_code: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator must be an http(s) URL such as http://host:8100, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._token = token or None
        self._join_code = join_code or None
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # the token stays out
        return f"WorkerClient({self.base_url!r})"

    @property
    def authenticates(self) -> bool:
        """Whether this client sends a bearer token."""
        return self._token is not None

    # transport ---------------------------------------------------------------
    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    def _open(self, method: str, path: str, data: Any = None, headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers=self._headers(headers))
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = error_detail(exc)
            exc.close()
            raise CoordinatorHTTPError(method, path, exc.code, detail) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise CoordinatorUnavailable(f"{method} {self.base_url}{path}: {reason}") from None

    def _json(self, method: str, path: str, payload: Any = None,
              headers: dict[str, str] | None = None) -> Any:
        """Send ``payload`` as JSON; the decoded answer, or None for 204 No Content."""
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        extra = {"Content-Type": "application/json", **(headers or {})} if body is not None else headers
        try:
            with self._open(method, path, body, extra) as response:
                status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:  # the connection broke while reading
            raise CoordinatorUnavailable(f"{method} {self.base_url}{path}: {exc}") from None
        if status == 204 or not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CoordinatorHTTPError(method, path, status, "answer is not JSON") from None

    # node routes ---------------------------------------------------------------
    def register(self, registration: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/nodes/register`` (with the join code) → ``{"node_id", "status"}``."""
        headers = {JOIN_CODE_HEADER: self._join_code} if self._join_code else None
        return self._json("POST", "/v1alpha1/nodes/register", registration, headers) or {}

    def node_heartbeat(self, node_id: str, heartbeat: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/nodes/{node_id}/heartbeat``."""
        return self._json("POST", f"/v1alpha1/nodes/{quote_segment(node_id)}/heartbeat", heartbeat) or {}

    def claim(self, node_id: str) -> dict[str, Any] | None:
        """``POST /v1alpha1/leases/claim`` → the Lease JSON, or None on 204 (nothing for this node)."""
        return self._json("POST", "/v1alpha1/leases/claim", {"node_id": node_id})

    # attempt routes --------------------------------------------------------------
    def attempt_heartbeat(self, lease_id: str) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/heartbeat`` → the renewed Lease JSON."""
        return self._json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/heartbeat") or {}

    def complete(self, lease_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/complete`` → ``{"accepted": bool, ...}``."""
        return self._json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/complete", body) or {}

    def fail(self, lease_id: str, reason: str) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/fail``."""
        return self._json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/fail", {"reason": reason}) or {}

    # artifacts -------------------------------------------------------------------
    def download(self, key: str, destination: Path) -> int:
        """``GET /v1alpha1/artifacts/{key}`` streamed into ``destination``; returns the byte count."""
        path = f"/v1alpha1/artifacts/{quote_key(key)}"
        with self._open("GET", path) as response, open(destination, "wb") as handle:
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:  # the connection broke mid-body
                    raise CoordinatorUnavailable(f"GET {self.base_url}{path}: {exc}") from None
                if not chunk:
                    return handle.tell()
                handle.write(chunk)

    def upload(self, key: str, source: Path) -> dict[str, Any]:
        """``PUT /v1alpha1/artifacts/{key}`` with the file's raw bytes (streamed) → the ArtifactRecord."""
        path = f"/v1alpha1/artifacts/{quote_key(key)}"
        size = source.stat().st_size
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with open(source, "rb") as body:
            try:
                with self._open("PUT", path, body, headers) as response:
                    raw = response.read()
            except (CoordinatorHTTPError, CoordinatorUnavailable):
                raise
            except (OSError, http.client.HTTPException) as exc:
                raise CoordinatorUnavailable(f"PUT {self.base_url}{path}: {exc}") from None
        try:
            record = json.loads(raw) if raw else {}
        except ValueError:
            record = {}
        return record if isinstance(record, dict) else {}
