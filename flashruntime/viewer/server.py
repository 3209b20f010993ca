"""``RunViewerServer``: the run page, its state and the offline docs on 127.0.0.1.

A stdlib ``ThreadingHTTPServer`` on a daemon thread, loopback only: the page shows a
run's logs and paths, so it is never reachable from another machine. Request logging
is silenced (the server shares the terminal with the user's run).
"""

from __future__ import annotations

import json
import mimetypes
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from flashruntime.viewer.page import render
from flashruntime.viewer.state import collect

__all__ = ["PACKAGED_DOCS", "RunViewerServer"]

PACKAGED_DOCS = Path(__file__).resolve().parent / "_docs"
HOST = "127.0.0.1"


class RunViewerServer:
    """Serves ``/`` (the page), ``/api/state`` (``collect(run_dir)``) and ``/docs/…``.

    ``port=0`` lets the OS pick a free port; ``start()`` returns the URL. ``docs_dir``
    defaults to the docs built into the package.
    """

    def __init__(self, run_dir: str | os.PathLike[str], port: int = 0,
                 docs_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535 (0 = any free port), got {port!r}")
        self.run_dir = Path(run_dir)
        self.port = port
        self.docs_dir = Path(docs_dir) if docs_dir is not None else PACKAGED_DOCS
        self.url: str | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        """Bind and serve on a daemon thread; returns ``"http://127.0.0.1:<port>"``. Idempotent."""
        with self._lock:
            if self._httpd is not None:
                return self.url  # type: ignore[return-value]
            handler = _handler_for(self.run_dir, self.docs_dir, render().encode("utf-8"))
            httpd = ThreadingHTTPServer((HOST, self.port), handler)
            httpd.daemon_threads = True
            self._httpd = httpd
            self.port = httpd.server_address[1]
            self.url = f"http://{HOST}:{self.port}"
            self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                            name=f"flashruntime-viewer-{self.port}", daemon=True)
            self._thread.start()
            return self.url

    def stop(self) -> None:
        """Stop serving and free the port. Idempotent; a stopped server cannot be restarted."""
        with self._lock:
            httpd, self._httpd = self._httpd, None
            thread, self._thread = self._thread, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> RunViewerServer:  # noqa: PYI034 (typing.Self needs 3.11)
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(run_dir: Path, docs_dir: Path, page: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.run_dir = run_dir
    Handler.docs_dir = docs_dir
    Handler.page = page
    Handler.state_lock = threading.Lock()
    return Handler


class _Handler(BaseHTTPRequestHandler):
    run_dir: Path
    docs_dir: Path
    page: bytes
    # One collect at a time: the first look at a large checkpoint hashes it, and polls from
    # several tabs must wait for that pass (then hit the hash cache), not start their own.
    state_lock: threading.Lock
    server_version = "flashruntime-viewer"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/":
            self._send(200, "text/html; charset=utf-8", self.page)
        elif path == "/api/state":
            with self.state_lock:
                state = collect(self.run_dir)
            body = json.dumps(state, allow_nan=False, default=str).encode("utf-8")
            self._send(200, "application/json", body)
        elif path == "/docs" or path.startswith("/docs/"):
            self._docs(path[len("/docs"):])
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found")

    def _docs(self, rest: str) -> None:
        root = self.docs_dir
        if not (root / "index.html").is_file():
            self._send(404, "text/plain; charset=utf-8", b"docs not built")
            return
        relative = unquote(rest).lstrip("/") or "index.html"
        try:
            target = (root / relative).resolve()
            inside = target.is_relative_to(root.resolve())
        except (OSError, ValueError):
            inside = False
        if inside and target.is_dir():
            target = target / "index.html"
        if not inside or not target.is_file():
            self._send(404, "text/plain; charset=utf-8", b"not found")
            return
        content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if content_type.startswith("text/") or content_type in ("application/javascript", "application/json"):
            content_type += "; charset=utf-8"
        try:
            body = target.read_bytes()
        except OSError:
            self._send(404, "text/plain; charset=utf-8", b"not found")
            return
        self._send(200, content_type, body)

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the tab closed mid-response
