"""A fault injector between a worker and a real coordinator: a stdlib HTTP proxy on
127.0.0.1 that forwards every request as it is, except the next one matching a rule the
test armed, which it holds until the test lets it go. It puts a worker at a moment of its
life the test chooses: registering, claiming, uploading, completing::

    proxy = HoldingProxy(coordinator_url).start()
    upload = proxy.hold("PUT", r"/v1alpha1/artifacts/jobs/.*/metrics\\.json")
    ...                         # the worker runs against proxy.url
    upload.wait_arrived()       # the worker is inside that upload now
    worker.send_signal(SIGTERM)
    upload.let_go()             # forwarded; the worker reads the answer and goes on
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection",
               "content-length", "host"}


class Held:
    """One armed rule: the first request matching it (after letting ``after`` of them pass)
    waits in the proxy until ``let_go``."""

    def __init__(self, method: str, pattern: str, after: int = 0) -> None:
        self.method = method
        self.pattern = re.compile(pattern)
        self.to_pass = after
        self.arrived = threading.Event()
        self._go = threading.Event()
        self.path: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and self.pattern.fullmatch(path.split("?", 1)[0]) is not None

    def wait_arrived(self, timeout: float = 60.0) -> str:
        """The held request's path, once it arrived (a hang guard, not a timing)."""
        if not self.arrived.wait(timeout):
            raise AssertionError(f"no {self.method} matching {self.pattern.pattern} arrived within {timeout} s")
        assert self.path is not None
        return self.path

    def let_go(self) -> None:
        self._go.set()

    def _wait_for_go(self) -> None:
        self._go.wait(120.0)  # a hang guard: a test that forgets to let go still ends


class HoldingProxy:
    """Forwards to ``upstream`` (``http://127.0.0.1:port``); ``hold`` arms a rule."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._lock = threading.Lock()
        self._rules: list[Held] = []
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None

    def hold(self, method: str, pattern: str, *, after: int = 0) -> Held:
        """Hold the next request matching ``method`` and the path ``pattern`` (a full match),
        once ``after`` matching ones have passed."""
        rule = Held(method, pattern, after)
        with self._lock:
            self._rules.append(rule)
        return rule

    def _take_rule(self, method: str, path: str) -> Held | None:
        with self._lock:
            self.requests.append((method, path))
            for rule in self._rules:
                if rule.matches(method, path):
                    if rule.to_pass:
                        rule.to_pass -= 1
                        return None
                    self._rules.remove(rule)
                    return rule
        return None

    def start(self) -> HoldingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                rule = proxy._take_rule(self.command, self.path)
                if rule is not None:
                    rule.path = self.path
                    rule.arrived.set()
                    rule._wait_for_go()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream = http.client.HTTPConnection(proxy._host, proxy._port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for name, value in answer.getheaders():
                        if name.lower() not in _HOP_BY_HOP:
                            self.send_header(name, value)
                finally:
                    upstream.close()
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        with self._lock:
            rules, self._rules = list(self._rules), []
        for rule in rules:
            rule.let_go()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
