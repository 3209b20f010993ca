"""``RunViewerServer`` over real HTTP on 127.0.0.1, and ``flash.submit`` starting it."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from flashruntime.viewer.server import PACKAGED_DOCS, RunViewerServer
from flashruntime.viewer.state import collect


def _get(url: str, path: str) -> tuple[int, str, bytes]:
    """A raw GET (http.client sends the path exactly as given, ``..`` included)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "contract": "viewer_v1", "workload": {"command": ["python", "t.py"], "mode": "local", "source": "."},
        "state": "SUCCEEDED", "started_at": 1.0, "finished_at": 2.0, "max_restarts": 0, "checkpoint_dir": None,
        "attempts": [], "events": [], "trials": []}))
    return run_dir


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "site"
    docs.mkdir()
    (docs / "index.html").write_text("<!doctype html><title>contents</title>")
    (docs / "sdk.html").write_text("<!doctype html><title>sdk</title>")
    (tmp_path / "secret.txt").write_text("outside the docs root")
    return docs


def test_page_state_and_unknown_routes(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    with RunViewerServer(run_dir, docs_dir=_docs(tmp_path)) as server:
        url = server.url
        assert url is not None and url.startswith("http://127.0.0.1:") and server.port > 0
        status, kind, body = _get(url, "/")
        assert status == 200 and kind.startswith("text/html") and body.startswith(b"<!doctype html>")
        status, kind, body = _get(url, "/api/state?poll=1")
        state = json.loads(body)
        assert status == 200 and kind == "application/json"
        expected = collect(run_dir)
        assert state["state"] == "SUCCEEDED" and state.keys() == expected.keys()
        for path in ("/nope", "/api/state/x", "/index.html"):
            assert _get(url, path)[0] == 404


def test_docs_routes_serve_inside_the_root_only(tmp_path: Path) -> None:
    with RunViewerServer(_run_dir(tmp_path), docs_dir=_docs(tmp_path)) as server:
        url = server.url
        assert url is not None
        for path in ("/docs", "/docs/", "/docs/index.html"):
            status, kind, body = _get(url, path)
            assert status == 200 and kind == "text/html; charset=utf-8" and b"contents" in body
        assert b"sdk" in _get(url, "/docs/sdk.html")[2]
        for path in ("/docs/../secret.txt", "/docs/%2e%2e/secret.txt", "/docs/..%2fsecret.txt",
                     "/docs//etc/passwd", "/docs/missing.html"):
            status, _, body = _get(url, path)
            assert status == 404 and b"outside" not in body, path


def test_without_built_docs_the_docs_routes_say_so(tmp_path: Path) -> None:
    with RunViewerServer(_run_dir(tmp_path), docs_dir=tmp_path / "no-docs") as server:
        assert server.url is not None
        assert _get(server.url, "/docs/") == (404, "text/plain; charset=utf-8", b"docs not built")


def test_the_packaged_docs_are_served_by_default(tmp_path: Path) -> None:
    assert (PACKAGED_DOCS / "index.html").is_file(), "run python -m scripts.build_docs"
    with RunViewerServer(_run_dir(tmp_path)) as server:
        assert server.url is not None
        status, _, body = _get(server.url, "/docs/recovery.html")
        assert status == 200 and b"coordinated_training" in body


def test_stop_frees_the_port_and_the_server_binds_loopback_only(tmp_path: Path) -> None:
    server = RunViewerServer(_run_dir(tmp_path))
    url = server.start()
    assert server.start() == url  # idempotent
    port = server.port
    assert _get(url, "/")[0] == 200
    server.stop()
    server.stop()
    with pytest.raises(OSError):
        _get(url, "/")
    with RunViewerServer(tmp_path, port=port) as again:  # the port is free for the next viewer
        assert again.url == url
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # and nothing listens on it after stop


def test_bad_port_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port must be an int in 0..65535"):
        RunViewerServer(tmp_path, port=70000)


def test_submit_with_watch_serves_the_run_it_started(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import webbrowser

    import flashruntime as flash
    from flashruntime.local import submit as sdk

    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", opened.append)
    workload = flash.CommandWorkload(command=[sys.executable, "-c", "print('hello from the run')"],
                                     source=flash.Source(path=str(tmp_path)))
    run = flash.submit(workload, output_dir=tmp_path / "out", watch=True)
    try:
        assert run.viewer_url is not None and opened == [run.viewer_url]
        assert f"viewer: {run.viewer_url}" in capsys.readouterr().out
        with urllib.request.urlopen(f"{run.viewer_url}/api/state", timeout=10) as response:
            state = json.load(response)
        assert state["state"] == "SUCCEEDED"
        assert any("hello from the run" in line for line in state["attempts"][0]["log_tail"])
    finally:
        for server in sdk._viewers:
            server.stop()
        sdk._viewers.clear()


def test_concurrent_polls_never_collect_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first collect of a big checkpoint hashes it; other tabs' polls wait for it
    (and then read the hash cache) instead of hashing the same files in parallel."""
    import threading
    import time

    from flashruntime.viewer import server as server_module

    inside = {"now": 0, "most": 0}
    guard = threading.Lock()

    def slow_collect(run_dir: Path) -> dict[str, object]:
        with guard:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        time.sleep(0.3)
        with guard:
            inside["now"] -= 1
        return {"error": "slow"}

    monkeypatch.setattr(server_module, "collect", slow_collect)
    with RunViewerServer(_run_dir(tmp_path)) as server:
        assert server.url is not None
        url = server.url
        threads = [threading.Thread(target=_get, args=(url, "/api/state")) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert inside["most"] == 1


def test_a_metric_too_large_for_a_float_is_served_as_null_not_a_dropped_poll(tmp_path: Path) -> None:
    """``1e999`` is valid JSON but parses to inf, which strict JSON cannot carry: before, every
    /api/state poll failed while the line was in the window."""
    run_dir = _run_dir(tmp_path)
    attempt = run_dir / "attempt-0"
    attempt.mkdir()
    (attempt / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 1e999, "grad": [-1e999, 2.0], "lr": NaN}\n')
    doc = json.loads((run_dir / "run.json").read_text())
    doc["attempts"] = [{"attempt": 0, "output_dir": "attempt-0"}]
    (run_dir / "run.json").write_text(json.dumps(doc))
    with RunViewerServer(run_dir) as server:
        assert server.url is not None
        status, kind, body = _get(server.url, "/api/state")
    assert status == 200 and kind == "application/json", body[:300]
    assert json.loads(body)["attempts"][0]["metrics"] == [
        {"step": 1, "loss": 0.5}, {"step": 2, "loss": None, "grad": [None, 2.0], "lr": None}]
