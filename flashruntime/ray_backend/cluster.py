"""The Ray cluster to run on: the address forms, and the connection.

``FLASHML_RAY_ADDRESS`` (``serve --ray-address``, ``flash.submit(ray_address=...)``) takes:
- ``local``: start an embedded single-node Ray in this process, for development;
- ``auto``: the cluster this machine belongs to (started with ``ray start``);
- ``ray://host:port``: a remote cluster through the Ray Client (KubeRay's head service);
- ``host:port``: a cluster's GCS address.

Ray is imported here only, inside functions: without the ``ray`` extra nothing imports it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any

from flashruntime.errors import BadRayAddress, ModuleUnavailable

__all__ = ["ADDRESS_FORMS", "ALIVE", "ALIVE_S", "ENDED", "LOST", "RAY_ADDRESS_ENV", "cluster_nodes", "connect",
           "import_ray", "on_node", "parse_ray_address", "placement", "read_stream", "total_cpus"]

RAY_ADDRESS_ENV = "FLASHML_RAY_ADDRESS"
ADDRESS_FORMS = "local, auto, ray://host:port or host:port"
REACH_TIMEOUT_S = 5.0
# What ``read_stream`` hands on after a streaming task's own messages: its end, or its failure.
ENDED, LOST = "ended", "lost"
# Ray delivers a cancel to a streaming task at its next yield: a running attempt yields this
# message at least every ALIVE_S, and its reader has nothing to act on in it.
ALIVE, ALIVE_S = "alive", 0.5
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")


def parse_ray_address(value: str, *, source: str = RAY_ADDRESS_ENV) -> str:
    """``value`` stripped, when it has one of the address forms; ``BadRayAddress`` naming
    ``source`` and the forms otherwise."""
    if not isinstance(value, str):
        raise BadRayAddress(f"{source} must be {ADDRESS_FORMS}, got {value!r}")
    address = value.strip()
    if address in ("local", "auto"):
        return address
    rest = address.removeprefix("ray://")
    if _HOST_PORT.match(rest) and 0 < int(rest.rsplit(":", 1)[1]) <= 65535:
        return address
    raise BadRayAddress(f"{source} must be {ADDRESS_FORMS} (e.g. ray://ray-head:10001), got {value!r}")


def import_ray() -> Any:
    """The ``ray`` module, or ``ModuleUnavailable`` saying which extra brings it."""
    try:
        import ray
    except ImportError as exc:
        raise ModuleUnavailable(
            f"the Ray backend needs Ray, which is not installed ({exc}); install the ray extra: "
            "pip install 'flashruntime[ray]'", name="ray") from None
    return ray


def connect(address: str, *, num_cpus: int | None = None) -> Any:
    """Connect this process to the cluster at ``address`` (already connected: nothing to do)
    and return the ``ray`` module. ``num_cpus`` sizes an embedded (``local``) Ray."""
    ray = import_ray()
    address = parse_ray_address(address)
    if ray.is_initialized():
        return ray
    # Ray's own INFO lines ("Started a local Ray instance") would interleave with the run's output.
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    if address == "local":
        if num_cpus is not None:
            options["num_cpus"] = num_cpus
        ray.init(**options)
        return ray
    if address != "auto":
        _require_reachable(address)
    ray.init(address=address, **options)
    return ray


def _require_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """``ConnectionError`` unless a TCP connection to ``address``'s host and port opens within
    ``timeout_s``: Ray itself retries an unreachable cluster for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(
            f"nothing answers at {host}:{port} ({exc.strerror or exc}); check the address, and that the Ray "
            f"head is running and reachable from here (ray://: the client port, 10001 by default; host:port: "
            "the GCS port, 6379 by default)") from None


def cluster_nodes(ray: Any) -> list[dict[str, float]]:
    """The total resources of each live node of the cluster."""
    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def total_cpus(ray: Any) -> int:
    """The CPUs of every live node together (at least 1): how many one-CPU tasks run at once."""
    return max(1, int(sum(node.get("CPU", 0.0) for node in cluster_nodes(ray))))


def placement() -> dict[str, Any]:
    """Where the calling Ray task runs: Ray node id, node IP, hostname, worker pid, GPU ids."""
    import ray

    try:
        gpu_ids = [str(gpu) for gpu in ray.get_gpu_ids()]
    except Exception:  # a worker without a GPU context
        gpu_ids = []
    return {
        "ray_node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "worker_pid": os.getpid(),
        "gpu_ids": gpu_ids,
    }


def on_node(ray: Any, function: Any, node_id: str) -> Any:
    """``function`` as a Ray task that runs on the node ``node_id`` and nowhere else, taking no
    CPU (the sweep of what a lost attempt left there must not wait for room)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(function).options(
        num_cpus=0, max_retries=3, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


def read_stream(ray: Any, stream: Any, sink: Callable[[tuple[str, Any]], None], name: str) -> threading.Thread:
    """Hand every message of a streaming Ray task (an ``ObjectRefGenerator``) to ``sink``, on a
    daemon thread of its own, then ``(ENDED, None)``, or ``(LOST, error)`` with what Ray raised
    (its worker died, it was cancelled). Reading may wait for as long as the task runs: after a
    cancel that Ray did not deliver, even its readiness checks wait for the task to end, so no
    loop that must stay responsive can read a stream itself."""

    def read() -> None:
        while True:
            try:
                message = ray.get(next(stream))
            except StopIteration:
                sink((ENDED, None))
                return
            except Exception as exc:  # whatever Ray raised for the task
                sink((LOST, exc))
                return
            sink(message)

    thread = threading.Thread(target=read, name=name, daemon=True)
    thread.start()
    return thread
