"""A real coordinator for tests: ``create_app`` served by uvicorn on 127.0.0.1, in a
thread of the test process (``serve_in_thread``) or as its own process
(``CoordinatorProcess``, for kill -9)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests._support import REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout_s: float = 30.0, process: subprocess.Popen[Any] | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"coordinator exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"coordinator at {url} not healthy after {timeout_s} s")


def settings_for(data_dir: Path, **overrides: Any) -> Any:
    from flashruntime.coordinator.settings import RuntimeSettings

    values: dict[str, Any] = {
        "ledger_path": str(data_dir / "flashruntime.db"),
        "artifacts_dir": str(data_dir / "artifacts"),
        "sweep_interval_s": 0.1,
    }
    values.update(overrides)
    return RuntimeSettings(**values)


@contextlib.contextmanager
def serve_in_thread(settings: Any) -> Iterator[str]:
    """Serve ``create_app(settings)`` until the block ends; yields the base URL."""
    from flashruntime.coordinator.app import create_app

    with serve_app_in_thread(create_app(settings)) as url:
        yield url


@contextlib.contextmanager
def serve_app_in_thread(app: Any) -> Iterator[str]:
    """Serve ``app``, one ``create_app`` built (a test may have added routes to it), until
    the block ends; yields the base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-coordinator", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class CoordinatorProcess:
    """``uvicorn --factory flashruntime.coordinator.app:create_app`` in its own process."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "FLASHML_LEDGER_PATH": str(data_dir / "flashruntime.db"),
            "FLASHML_LOCAL_ARTIFACTS_DIR": str(data_dir / "artifacts"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> CoordinatorProcess:
        argv = [sys.executable, "-m", "uvicorn", "--factory", "flashruntime.coordinator.app:create_app",
                "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.process = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(self.url, process=self.process)
        return self

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_COORDINATOR_ENV = ("FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS", "FLASHML_JOIN_CODE", "FLASHML_RUNTIME_API",
                    "FLASHML_LEDGER_PATH", "FLASHML_LOCAL_ARTIFACTS_DIR", "FLASHML_REQUIRE_NODE_AUTH",
                    "FLASHML_DATABASE_URL")


def process_env(**extra: str) -> dict[str, str]:
    """The environment for a ``flashruntime`` subprocess: this checkout importable, no
    coordinator settings inherited from the developer's shell."""
    env = {k: v for k, v in os.environ.items() if k not in _COORDINATOR_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def stop_process(process: subprocess.Popen[str]) -> str:
    """SIGTERM (a clean stop for serve and worker), then SIGKILL after 60 s; → its output."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out or ""


def run_worker(url: str, work_dir: Path, *options: str, max_tasks: int, timeout: float = 240) -> tuple[int, str]:
    """A real ``flashruntime worker`` process against ``url`` until it has taken ``max_tasks``
    tasks (then it exits by itself); ``timeout`` is a hang guard. → (exit code, its output)."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(work_dir),
         "--poll-seconds", "0.2", "--max-tasks", str(max_tasks), *options],
        env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = worker.communicate(timeout=timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
            log, _ = worker.communicate()
    return worker.returncode, log
