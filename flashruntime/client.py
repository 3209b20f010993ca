"""The one client of a coordinator's HTTP API, standard library only (``urllib``).

``CoordinatorClient`` speaks every route a program outside the coordinator uses: the
agent's node, lease and artifact routes, a submitter's job routes, an operator's node
routes. Every call carries ``Authorization: Bearer <token>`` when a token is given.

Failures map to the error family here and nowhere else: an HTTP error status is a
``CoordinatorHTTPError`` (``status``, the server's ``detail``; a missing artifact an
``ArtifactNotFound``), a connection that fails or breaks is ``CoordinatorUnavailable``,
an answer that is not JSON a ``CoordinatorHTTPError`` too. Callers branch on types, never
on urllib's. ``RetryPolicy`` is the one retry rule: idempotent calls are retried on
transient failures (connection errors, 5xx, 429) with capped exponential backoff; a call
that could act twice (submitting a job, claiming, failing a lease) is tried once.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import select
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import flashruntime
from flashruntime.errors import ArtifactNotFound, CoordinatorHTTPError, CoordinatorUnavailable

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "JOIN_CODE_HEADER",
    "NO_RETRY",
    "CoordinatorClient",
    "RetryPolicy",
    "is_transient",
    "quote_key",
    "quote_segment",
]

JOIN_CODE_HEADER = "X-FlashML-Join-Code"
DEFAULT_TIMEOUT_S = 60.0
_CHUNK = 1024 * 1024
_DETAIL_CHARS = 500
# Bodies up to this fit in the sockets' buffers whole, so a refusal sent before the server
# read them still arrives; larger ones wait for the server's "100 Continue".
_EXPECT_CONTINUE_ABOVE = 1024 * 1024


def quote_segment(value: object) -> str:
    """One path segment (a job, node or lease id): every ``/`` is escaped."""
    return urllib.parse.quote(str(value), safe="")


def quote_key(key: str) -> str:
    """An artifact key, whose ``/`` separators stay: ``/v1alpha1/artifacts/{key:path}``."""
    return urllib.parse.quote(key, safe="/")


def is_transient(exc: BaseException) -> bool:
    """Whether a failed call is worth repeating: the coordinator unreachable or its
    connection broken, an HTTP 5xx, or 429 (its rate limit). Other 4xx are answers.
    Also recognises urllib's own errors, which user-written coordinators may raise."""
    if isinstance(exc, CoordinatorHTTPError):
        return exc.status >= 500 or exc.status == 429
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (CoordinatorUnavailable, urllib.error.URLError, ConnectionError, TimeoutError,
                            http.client.HTTPException))


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure: up to ``attempts`` tries in
    all, waiting ``backoff_s * 2**(n - 1)`` (at most ``max_backoff_s``) before retry n, or
    what a 429's ``Retry-After`` asks when that is longer. ``sleep`` waits (tests pass a fake)."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 5.0
    sleep: Callable[[float], object] = time.sleep

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                        and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")

    def delay(self, retry: int, exc: BaseException | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 = the first retry)."""
        wait = min(self.max_backoff_s, self.backoff_s * 2.0 ** max(0, retry - 1))
        asked = getattr(exc, "retry_after_s", None)
        if isinstance(asked, (int, float)) and math.isfinite(asked) and asked > wait:
            wait = min(float(asked), max(self.max_backoff_s, wait))
        return wait

    def run(self, call: Callable[[], Any], *, retry: bool = True,
            retry_on: Callable[[BaseException], bool] = is_transient) -> Any:
        """``call()``, repeated while it fails with an error ``retry_on`` accepts (a transient
        one) and tries remain; just once when ``retry`` is false. The last failure propagates."""
        tries = self.attempts if retry else 1
        for attempt in range(1, tries + 1):
            try:
                return call()
            except Exception as exc:
                if attempt == tries or not retry_on(exc):
                    raise
                self.sleep(self.delay(attempt, exc))
        raise AssertionError("unreachable")  # pragma: no cover


NO_RETRY = RetryPolicy(attempts=1)


def _detail(raw: bytes) -> str:
    """The ``detail`` of an error body (a sentence, or a 422's problems one per line), else its text."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:_DETAIL_CHARS]
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(detail, str):
        return detail[:_DETAIL_CHARS * 4]
    if isinstance(detail, list) and all(isinstance(issue, dict) and "msg" in issue for issue in detail):
        return "".join(f"\n  {'.'.join(str(part) for part in issue.get('loc', ()))}: {issue['msg']}"
                       for issue in detail)  # a refused body's problems, one per line
    return json.dumps(detail)[:_DETAIL_CHARS]


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class CoordinatorClient:
    """A coordinator at ``base_url`` (``http://host:8100`` or ``https://…``).

    ``token``: sent as the bearer token; ``headers``: sent with every call too (a
    delegation header, say); ``join_code``: sent with registration; ``retry``: the
    policy for idempotent calls (``NO_RETRY`` to try each once).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        join_code: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        user_agent: str = f"flashruntime/{flashruntime.__version__}",
    ) -> None:
        if not isinstance(base_url, str) or not base_url.strip().lower().startswith(("http://", "https://")):
            raise ValueError(f"coordinator must be an http(s) URL such as http://host:8100, got {base_url!r}")
        self.base_url = base_url.strip().rstrip("/")
        self._token = token.strip() if isinstance(token, str) and token.strip() else None
        self._headers = dict(headers or {})
        self._join_code = join_code or None
        self.timeout_s = timeout_s
        self.retry = retry if retry is not None else RetryPolicy()
        self._user_agent = user_agent

    def __repr__(self) -> str:  # the token and headers stay out
        return f"CoordinatorClient({self.base_url!r})"

    @property
    def authenticates(self) -> bool:
        """Whether this client sends a bearer token."""
        return self._token is not None or any(name.lower() == "authorization" for name in self._headers)

    # transport -----------------------------------------------------------------
    def _request_headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent, **self._headers}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    def _open(self, method: str, path: str, data: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        """The open response of one try; HTTP errors and connection failures mapped."""
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers=self._request_headers(headers))
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            try:
                raw = exc.read()
            except (OSError, http.client.HTTPException):
                raw = b""
            exc.close()
            raise _http_error(method, path, exc.code, raw, exc.headers,
                              exc.reason if isinstance(exc.reason, str) else "") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise CoordinatorUnavailable(f"{method} {self.base_url}{path}: {reason}") from None

    def _read(self, method: str, path: str, response: Any) -> tuple[int, bytes]:
        try:
            with response:
                return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:  # the connection broke while reading
            raise CoordinatorUnavailable(f"{method} {self.base_url}{path}: {exc}") from None

    def request_json(self, method: str, path: str, payload: Any = None, *, idempotent: bool,
                     headers: Mapping[str, str] | None = None) -> Any:
        """Send ``payload`` as JSON; the decoded answer, or None for 204 No Content.
        Retried by the policy only when ``idempotent``."""
        body = None if payload is None else json.dumps(payload, allow_nan=False).encode("utf-8")
        extra = {"Content-Type": "application/json", **(headers or {})} if body is not None else headers

        def once() -> Any:
            status, raw = self._read(method, path, self._open(method, path, body, extra))
            if status == 204 or not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise CoordinatorHTTPError(method, path, status,
                                           f"the answer is not JSON ({raw[:80]!r}); is {self.base_url} a "
                                           "flashruntime coordinator?") from None

        return self.retry.run(once, retry=idempotent)

    # jobs ----------------------------------------------------------------------
    def submit_job(self, spec: Mapping[str, Any], *, sign_key: Any = None) -> dict[str, Any]:
        """``POST /v1alpha1/jobs`` → the ``JobRecord`` as JSON. Tried once (a repeat could
        submit twice), except after a 429: the coordinator refused that one unread.
        ``sign_key``: a ``flashruntime.signing.SigningKey`` or the path of one; the command job
        is signed with it (``sign_job_spec``), so workers that trust its public key run it."""
        if sign_key is not None:
            from flashruntime.signing import SigningKey, load_signing_key, sign_job_spec

            key = sign_key if isinstance(sign_key, SigningKey) else load_signing_key(sign_key)
            spec = sign_job_spec(spec, key)
        body = dict(spec)
        return self.retry.run(lambda: self.request_json("POST", "/v1alpha1/jobs", body, idempotent=False),
                              retry_on=_rate_limited)

    def whoami(self) -> dict[str, Any]:
        """``GET /v1alpha1/whoami`` → ``{role, name, may_run_code, artifact_prefix}``: the caller
        as the coordinator sees it (role None in open mode)."""
        return self.request_json("GET", "/v1alpha1/whoami", idempotent=True)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.request_json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}", idempotent=True)

    def jobs(self) -> list[dict[str, Any]]:
        return self.request_json("GET", "/v1alpha1/jobs", idempotent=True)

    def job_state(self, job_id: str) -> str:
        return str(self.job(job_id)["state"])

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self.request_json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/events", idempotent=True)

    def logs(self, job_id: str, *, task: str | None = None, tail: int | None = None) -> dict[str, Any]:
        """``GET /v1alpha1/jobs/{id}/logs`` → ``{"logs": str, "tasks": [{task_id, state, node_id,
        log, truncated}]}``: every task's log, or only ``task``'s; ``tail``: the last lines of each."""
        query = {name: value for name, value in (("task", task), ("tail", tail)) if value is not None}
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        return self.request_json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/logs{suffix}", idempotent=True)

    def tasks(self, job_id: str) -> list[dict[str, Any]]:
        return self.request_json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/tasks", idempotent=True)

    def job_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """``[{uri, key, size_bytes, sha256}]`` under ``jobs/<job_id>/``."""
        return self.request_json("GET", f"/v1alpha1/jobs/{quote_segment(job_id)}/artifacts", idempotent=True)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.request_json("POST", f"/v1alpha1/jobs/{quote_segment(job_id)}/cancel", idempotent=True)

    # nodes ---------------------------------------------------------------------
    def register(self, registration: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/nodes/register`` (with the join code) → ``{"node_id", "status"}``."""
        headers = {JOIN_CODE_HEADER: self._join_code} if self._join_code else None
        return self.request_json("POST", "/v1alpha1/nodes/register", dict(registration), idempotent=True,
                                 headers=headers) or {}

    def node_heartbeat(self, node_id: str, heartbeat: Mapping[str, Any], *, retry: bool = True) -> dict[str, Any]:
        """``retry=False`` for a caller whose own loop sends the next one soon anyway."""
        return self.request_json("POST", f"/v1alpha1/nodes/{quote_segment(node_id)}/heartbeat", dict(heartbeat),
                                 idempotent=retry) or {}

    def nodes(self) -> list[dict[str, Any]]:
        return self.request_json("GET", "/v1alpha1/nodes", idempotent=True)

    # leases --------------------------------------------------------------------
    def claim(self, node_id: str, job_id: str | None = None) -> dict[str, Any] | None:
        """``POST /v1alpha1/leases/claim`` → the Lease JSON, or None on 204 (nothing for this node)."""
        body: dict[str, Any] = {"node_id": node_id}
        if job_id is not None:
            body["job_id"] = job_id
        return self.request_json("POST", "/v1alpha1/leases/claim", body, idempotent=False)

    def attempt_heartbeat(self, lease_id: str, *, retry: bool = True,
                          stragglers: list[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """``retry=False`` for a caller whose own loop sends the next one soon anyway;
        ``stragglers``: the ranks the worker found straggling since the last heartbeat."""
        body = {"stragglers": [dict(report) for report in stragglers]} if stragglers else None
        return self.request_json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/heartbeat", body,
                                 idempotent=retry) or {}

    def watch_attempt(self, lease_id: str, wait_s: float) -> dict[str, Any]:
        """``GET /v1alpha1/attempts/{lease_id}/watch``: a ``LeaseStanding`` as soon as the lease
        stops being live (cancelled: stop the task), or after ``wait_s``. Tried once: the
        watcher's own loop asks again."""
        query = urllib.parse.urlencode({"wait_s": f"{wait_s:g}"})
        return self.request_json("GET", f"/v1alpha1/attempts/{quote_segment(lease_id)}/watch?{query}", None,
                                 idempotent=False) or {}

    def complete(self, lease_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/complete`` → ``{"accepted": bool, ...}``; a repeat
        of an accepted commit is answered as accepted, so it is retried like a read."""
        return self.request_json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/complete", dict(body),
                                 idempotent=True) or {}

    def fail(self, lease_id: str, reason: str, *, exit_code: int | None = None, hung: bool = False) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/fail``; ``exit_code`` of the attempt's command, when it
        ran, lets the coordinator judge the failure from it and the task's log; ``hung``: the
        worker's hang watch stopped it."""
        body: dict[str, Any] = {"reason": reason}
        if exit_code is not None:
            body["exit_code"] = exit_code
        if hung:
            body["hung"] = True
        return self.request_json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/fail", body,
                                 idempotent=False) or {}

    def release(self, lease_id: str, reason: str, *, abandoned: bool = False) -> dict[str, Any]:
        """``POST /v1alpha1/attempts/{lease_id}/release`` → ``{"status": "requeued" | "exhausted"}``:
        the lease given back without failing its task (its worker is shutting down), or, with
        ``abandoned``, reported lost by the restarted worker that held it (counted as an
        expiry). A coordinator without the route answers 404."""
        return self.request_json("POST", f"/v1alpha1/attempts/{quote_segment(lease_id)}/release",
                                 {"reason": reason, "abandoned": abandoned}, idempotent=False) or {}

    # checkpoints of lease tasks ------------------------------------------------
    def _checkpoints_path(self, job_id: str, task_id: str, route: str) -> str:
        return f"/v1alpha1/jobs/{quote_segment(job_id)}/tasks/{quote_segment(task_id)}/checkpoints/{route}"

    def register_checkpoint_part(self, job_id: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST …/checkpoints/parts`` (``{attempt_id, step, part}``); the last registration of
        a key wins, so it is retried like a read."""
        return self.request_json("POST", self._checkpoints_path(job_id, task_id, "parts"), dict(body),
                                 idempotent=True) or {}

    def commit_checkpoint(self, job_id: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST …/checkpoints/commit`` → the committed manifest; a refusal is a 409. Tried once:
        a repeat would commit a second manifest of the same step."""
        return self.request_json("POST", self._checkpoints_path(job_id, task_id, "commit"), dict(body),
                                 idempotent=False) or {}

    def latest_checkpoint(self, job_id: str, task_id: str) -> dict[str, Any] | None:
        """``GET …/checkpoints/latest`` → the task's selectable manifest, or None when it has none."""
        try:
            return self.request_json("GET", self._checkpoints_path(job_id, task_id, "latest"), idempotent=True)
        except CoordinatorHTTPError as exc:
            if exc.status == 404:
                return None
            raise

    # artifacts -----------------------------------------------------------------
    def get_artifact(self, key: str) -> bytes:
        """``GET /v1alpha1/artifacts/{key}`` → the bytes; a missing one raises ``ArtifactNotFound``."""
        path = f"/v1alpha1/artifacts/{quote_key(key)}"
        return self.retry.run(lambda: self._read("GET", path, self._open("GET", path))[1])

    def download(self, key: str, destination: Path) -> int:
        """``GET /v1alpha1/artifacts/{key}`` streamed into ``destination``; → the byte count."""
        path = f"/v1alpha1/artifacts/{quote_key(key)}"

        def once() -> int:
            with self._open("GET", path) as response, open(destination, "wb") as handle:
                while True:
                    try:
                        chunk = response.read(_CHUNK)
                    except (OSError, http.client.HTTPException) as exc:  # the connection broke mid-body
                        raise CoordinatorUnavailable(f"GET {self.base_url}{path}: {exc}") from None
                    if not chunk:
                        return handle.tell()
                    handle.write(chunk)

        return self.retry.run(once)

    def put_artifact(self, key: str, data: bytes | Path, content_type: str = "application/octet-stream", *,
                     retry: bool = True) -> dict[str, Any]:
        """``PUT /v1alpha1/artifacts/{key}`` with ``data`` (bytes, or a file streamed from disk)
        as the body → the ``ArtifactRecord`` as JSON. ``retry=False`` for a caller that sends
        a newer version soon anyway."""
        path = f"/v1alpha1/artifacts/{quote_key(key)}"

        def send(body: bytes | BinaryIO, size: int) -> bytes:
            headers = {"Content-Type": content_type, "Content-Length": str(size)}
            if size <= _EXPECT_CONTINUE_ABOVE or _through_a_proxy(self.base_url):
                return self._read("PUT", path, self._open("PUT", path, body, headers))[1]
            # A large body goes once the coordinator has seen the headers and not refused them, so
            # a refusal (too large, a full disk) is read as an answer, not as a broken connection.
            try:
                status, answer_headers, raw = _send_expecting_continue(
                    "PUT", self.base_url + path, body, size, self._request_headers(headers), timeout_s=self.timeout_s)
            except (OSError, http.client.HTTPException) as exc:
                raise CoordinatorUnavailable(f"PUT {self.base_url}{path}: {exc}") from None
            if status >= 400:
                raise _http_error("PUT", path, status, raw, {name.title(): value for name, value in answer_headers.items()},
                                  http.client.responses.get(status, ""))
            return raw

        def once() -> Any:
            if isinstance(data, (bytes, bytearray)):
                raw = send(bytes(data), len(data))
            else:
                with open(data, "rb") as stream:
                    raw = send(stream, os.fstat(stream.fileno()).st_size)
            try:
                record = json.loads(raw) if raw else {}
            except ValueError:
                record = {}
            return record if isinstance(record, dict) else {}

        return self.retry.run(once, retry=retry)

    def put_json_artifact(self, key: str, value: Any) -> dict[str, Any]:
        """``put_artifact`` of ``value`` as JSON."""
        return self.put_artifact(key, json.dumps(value, allow_nan=False).encode("utf-8"), "application/json")


def _http_error(method: str, path: str, status: int, raw: bytes, headers: Any, reason: str) -> CoordinatorHTTPError:
    """The error for an HTTP error answer: its ``detail`` (else the reason phrase) and ``Retry-After``."""
    detail = _detail(raw) if raw else reason
    error_type = ArtifactNotFound if status == 404 and path.startswith("/v1alpha1/artifacts/") else CoordinatorHTTPError
    return error_type(method, path, status, detail, retry_after_s=_retry_after(headers))


def _through_a_proxy(base_url: str) -> bool:
    """Whether urllib would send requests to ``base_url`` through a proxy (``HTTP(S)_PROXY``)."""
    parts = urllib.parse.urlsplit(base_url)
    return parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname or "")


# --- a large upload: its body sent only once the server says it wants it ------------------
# (``Expect: 100-continue``, as RFC 9110 describes it). A server that refuses a request from
# its headers alone (a body over its limit: 413; a full disk: 503) answers before the body is
# sent, so the client reads that answer instead of a connection the server closed under a
# body it would not read. A server that says nothing within ``wait_s`` gets the body anyway.

_HEAD_LIMIT = 64 * 1024  # an interim or refusing answer's status line and headers, at most

_Answer = tuple[int, dict[str, str], bytes]  # status, headers (lower-case names), body


def _send_expecting_continue(method: str, url: str, body: bytes | BinaryIO, size: int, headers: Mapping[str, str],
                            *, timeout_s: float, wait_s: float = 1.0) -> _Answer:
    """Send ``method url`` with ``headers`` and ``Expect: 100-continue``, then ``body``
    (``size`` bytes) unless the server answered first. → the final answer. Transport
    failures raise ``OSError`` or ``http.client.HTTPException``."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(size), "Expect": "100-continue"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        sock = connection.sock
        early = _early_answer(sock, wait_s) if sock is not None else None
        if early is not None:
            return early
        try:
            if isinstance(body, (bytes, bytearray)):
                connection.send(bytes(body))
            else:
                while block := body.read(_CHUNK):
                    connection.send(block)
        except (BrokenPipeError, ConnectionResetError) as failed:
            # The server answered, and closed, while the body was on its way: its answer may
            # still be there to read; if not, the send's failure is what happened.
            try:
                response = connection.getresponse()
            except (OSError, http.client.HTTPException):
                raise failed from None
            raw = response.read()
            return response.status, {name.lower(): value for name, value in response.getheaders()}, raw
        response = connection.getresponse()
        raw = response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}, raw
    finally:
        connection.close()


def _early_answer(sock: socket.socket, wait_s: float) -> _Answer | None:
    """What the server said before the body: None for "100 Continue" or silence (send it),
    else its final answer, read whole."""
    if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
        readable, _, _ = select.select([sock], [], [], wait_s)
        if not readable:
            return None
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data:
            raise http.client.RemoteDisconnected("the server closed the connection before answering")
        head += data
        if len(head) > _HEAD_LIMIT:
            raise http.client.LineTooLong("the server's answer before the body")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        raise http.client.BadStatusLine(status_line) from None
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    if status == 100:
        return None
    length = int(found.get("content-length", "0") or 0)
    raw = b""
    while len(raw) < length:
        data = sock.recv(min(_CHUNK, length - len(raw)))
        if not data:
            break
        raw += data
    return status, found, raw


def _rate_limited(exc: BaseException) -> bool:
    return isinstance(exc, CoordinatorHTTPError) and exc.status == 429
