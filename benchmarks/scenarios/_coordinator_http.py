"""Shared by the coordinator scenarios (``coordinator_claims``, ``lease_mttd_mttr``): a
real ``flashruntime serve`` subprocess on 127.0.0.1 with its data under
``benchmarks/.work``, and the small HTTP helpers a client needs (register, the job
spec, upload-then-complete as the complete procedure requires).

The underscore keeps the registry from treating this module as a scenario.
Benchmarks never import from ``tests/``, so what the tests' ``service_server`` does
is written out again here, sized to what the scenarios need.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
WORK_DIR = REPO_ROOT / "benchmarks" / ".work"  # git-ignored scratch space on the repository's filesystem
SERVICE_MODULES = ("fastapi", "uvicorn", "httpx")

# Coordinator settings a developer's shell may carry; a benchmark coordinator runs open, on its own paths.
_COORDINATOR_ENV = (
    "FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS", "FLASHML_JOIN_CODE", "FLASHML_RUNTIME_API",
    "FLASHML_LEDGER_PATH", "FLASHML_LOCAL_ARTIFACTS_DIR", "FLASHML_REQUIRE_NODE_AUTH", "FLASHML_SWEEP_INTERVAL_S",
)

def service_missing() -> str | None:
    """Why the coordinator cannot run here (a skip reason), or None when it can."""
    import importlib.util

    missing = [name for name in SERVICE_MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"the service extra is not installed (missing {', '.join(missing)}): "
            "pip install 'flashruntime[service]'")


def make_work_dir(name: str) -> Path:
    """A fresh scratch directory under ``benchmarks/.work`` (never tmpfs); the caller removes it."""
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=WORK_DIR))


def subprocess_env() -> dict[str, str]:
    """This checkout importable; no coordinator settings inherited from the shell."""
    env = {k: v for k, v in os.environ.items() if k not in _COORDINATOR_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_client(url: str, timeout_s: float = 30.0) -> Any:
    """An ``httpx.Client`` on the coordinator (keep-alive; proxies from the environment ignored)."""
    import httpx

    return httpx.Client(base_url=url, timeout=timeout_s, trust_env=False)


class ServeProcess:
    """``flashruntime serve --host 127.0.0.1 --port P --data-dir D`` as a subprocess.

    Start it with ``serving(...)``, which stops it (SIGTERM, then SIGKILL) on the way
    out, errors included. ``sweep_interval_s=None`` keeps the coordinator's default."""

    def __init__(self, data_dir: Path, *, sweep_interval_s: float | None = None, start_timeout_s: float = 60.0,
                 database_url: str | None = None, ray_address: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.ray_address = ray_address
        self.extra_env = dict(env or {})
        self.sweep_interval_s = sweep_interval_s
        self.database_url = database_url
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"serve-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        database = ["--database-url", self.database_url] if self.database_url else []
        ray = ["--ray-address", self.ray_address] if self.ray_address else []
        return [sys.executable, "-m", "flashruntime.cli", "serve", "--host", "127.0.0.1", "--port",
                str(self.port), "--data-dir", str(self.data_dir), *database, *ray, "--log-level", "warning"]

    def env(self) -> dict[str, str]:
        env = subprocess_env()
        if self.sweep_interval_s is not None:
            env["FLASHML_SWEEP_INTERVAL_S"] = repr(float(self.sweep_interval_s))
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv(), env=self.env(), cwd=str(self.data_dir.parent),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _wait_healthy(self) -> None:
        import httpx

        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        with http_client(self.url, timeout_s=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"flashruntime serve exited with {self.process.returncode}: {self.log_tail()}")
                try:
                    if client.get("/healthz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"flashruntime serve at {self.url} not healthy after {self.start_timeout_s} s: "
                           f"{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (serve shuts down cleanly), then SIGKILL after 15 s."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def serving(data_dir: Path, *, sweep_interval_s: float | None = None, database_url: str | None = None,
            ray_address: str | None = None, env: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """A healthy ``flashruntime serve`` for the block (on ``database_url`` when given, else
    the SQLite file in ``data_dir``; running ``ray`` jobs on ``ray_address`` when given, with
    ``env`` added to its environment); stopped however the block ends."""
    server = ServeProcess(data_dir, sweep_interval_s=sweep_interval_s, database_url=database_url,
                          ray_address=ray_address, env=env)
    try:
        server.start()
        yield server
    except Exception as exc:
        server.stop()
        tail = server.log_tail(800).strip()
        if not tail:
            raise
        raise RuntimeError(f"{exc} [flashruntime serve log: {tail}]") from exc
    finally:
        server.stop()


def job_spec(trials: int, lease_seconds: float, name: str = "bench") -> dict[str, Any]:
    """A ``hyperparameter_search`` lease job of ``trials`` tasks (ids ``trial-000`` ...)."""
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": name},
        "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/bench", "tag": "dev"},
                 "workload": {"type": "hyperparameter_search",
                              "parameters": {"trials": [{"i": i} for i in range(trials)],
                                             "lease_seconds": lease_seconds}}},
    }


def registration(node_id: str) -> dict[str, Any]:
    return {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.bench", "module_capable": True,
            "capabilities": {"cpu_cores": 1, "pools": []}}


def submit(client: Any, spec: dict[str, Any]) -> str:
    response = client.post("/v1alpha1/jobs", json=spec)
    if response.status_code != 201:
        raise RuntimeError(f"job refused: {response.status_code} {response.text}")
    return str(response.json()["job_id"])


def register(client: Any, node_id: str) -> None:
    response = client.post("/v1alpha1/nodes/register", json=registration(node_id))
    if response.status_code != 200:
        raise RuntimeError(f"registration of {node_id} refused: {response.status_code} {response.text}")


def metrics_payload(lease: dict[str, Any]) -> bytes:
    return json.dumps({"task_id": lease["task_id"], "lease_id": lease["lease_id"], "score": 1.0}).encode()


def upload_and_complete(client: Any, lease: dict[str, Any]) -> dict[str, Any]:
    """What the coordinator accepts as a commit: PUT ``<output_prefix>metrics.json``, then complete with its sha256."""
    payload = metrics_payload(lease)
    key = lease["payload"]["output_prefix"] + "metrics.json"
    put = client.put(f"/v1alpha1/artifacts/{key}", content=payload)
    if put.status_code != 200:
        raise RuntimeError(f"artifact PUT {key} refused: {put.status_code} {put.text}")
    done = client.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                       json={"output_sha256": hashlib.sha256(payload).hexdigest()})
    if done.status_code != 200:
        raise RuntimeError(f"complete of {lease['lease_id']} failed: {done.status_code} {done.text}")
    return dict(done.json())


def parse_timestamp(text: str) -> float:
    """An event's ISO timestamp as epoch seconds."""
    from datetime import datetime, timezone

    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
