"""A multi-node job's node task on this machine: the job's command under torchrun, joined
to the job's c10d rendezvous on the coordinator's store (see ``flashruntime.protocol.gang``).

torchrun, not the agent, keeps the group going: with ``--nnodes=MIN:MAX`` its elastic agent
meets the other nodes in the rendezvous, restarts the local ranks when a node is lost
(``--max-restarts`` failures) and when one joins, and carries on with at least MIN nodes.
The store lives with the coordinator (``--rdzv-conf=is_host=0``: no node hosts it), so the
nodes left can meet again after any one of them is gone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from flashruntime.agent.inputs import TaskRefused
from flashruntime.errors import WorkerConfigError
from flashruntime.protocol.gang import GANG_KEY, Gang

__all__ = ["checked_node_addr", "gang_argv", "gang_env", "gang_of", "rendezvous_host"]


def gang_of(payload: Mapping[str, Any]) -> Gang | None:
    """The payload's gang, or None; ``TaskRefused`` when it is malformed or lacks its port."""
    raw = payload.get(GANG_KEY)
    if raw is None:
        return None
    try:
        gang = Gang.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the object)"
        raise TaskRefused(f"payload gang.{where}: {first['msg']}") from None
    if gang.port is None:
        raise TaskRefused("payload gang names no rendezvous port: the coordinator that queued it serves no "
                          "rendezvous store (flashruntime serve --rendezvous-port PORT)")
    if gang.min_nodes > gang.max_nodes:
        raise TaskRefused(f"payload gang has min_nodes {gang.min_nodes} > max_nodes {gang.max_nodes}")
    return gang


def rendezvous_host(coordinator_url: str) -> str:
    """The host of the coordinator's rendezvous store: the one this agent reaches it at."""
    host = urlsplit(coordinator_url).hostname
    if not host:
        raise TaskRefused(f"cannot tell the coordinator's host from {coordinator_url!r}")
    return f"[{host}]" if ":" in host else host


def checked_node_addr(addr: str | None) -> str | None:
    """``--node-addr`` as given (a host name or IP address), ``WorkerConfigError`` when it cannot be one."""
    if addr is None:
        return None
    if not addr or len(addr) > 253 or any(char.isspace() or char in "/,=" for char in addr):
        raise WorkerConfigError(f"--node-addr {addr!r} is not a host name or IP address; give the address the "
                                "other nodes reach this machine at, e.g. --node-addr 10.0.0.7")
    return addr


def gang_argv(argv: list[str], gang: Gang, host: str, node_addr: str | None = None) -> list[str]:
    """``argv`` (one rank's command) as this node's torchrun: run by the command's own Python
    when it names one (that Python has the job's torch), else by this agent's. ``node_addr``:
    torchrun's ``--local-addr``, the address this node is known by in the rendezvous."""
    program = argv[0]
    python = program if os.path.basename(program).startswith("python") else sys.executable
    local = [] if node_addr is None else [f"--local-addr={node_addr}"]
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={gang.min_nodes}:{gang.max_nodes}",
        f"--nproc-per-node={gang.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{gang.port}",
        f"--rdzv-id={gang.rdzv_id or gang.run_id}",
        f"--rdzv-conf=is_host=0,last_call_timeout={gang.last_call_s}",
        f"--max-restarts={gang.max_restarts}",
        *local,
        "--no-python",  # each rank runs argv exactly as given, whatever it starts with
        *argv,
    ]


def gang_env(gang: Gang) -> dict[str, str]:
    """What a node's ranks get besides the contract: the most ranks the run may have (so
    ``flashruntime.torch`` lists every size its checkpoints load at) and, when the job names
    one, the shared checkpoint directory every node reads and writes."""
    env = {"FLASHML_MAX_WORLD_SIZE": str(gang.world_sizes[1])}
    if gang.checkpoint_dir is not None:
        env["FLASHML_CKPT_DIR"] = gang.checkpoint_dir
    return env
