"""``ddp``: a PyTorch script under torchrun, on one node or several.

Single node uses torchrun's standalone rendezvous bound to loopback; several nodes
join one c10d rendezvous at ``rdzv_endpoint``, every participant submitting the same
workload. Only argv is built here: torch is not imported.
"""

from __future__ import annotations

import shlex

from flashruntime.protocol.plan_v1alpha1 import CheckpointPolicy
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

__all__ = ["ddp"]

_CHECKPOINT_NOTE = (
    "flashruntime.torch writes step-NNNNNN/ checkpoints with verifying manifests under FLASHML_CKPT_DIR; "
    "a relaunch resumes from the latest valid one"
)


def _check_endpoint(rdzv_endpoint: str | None, nnodes: int) -> str:
    if not rdzv_endpoint:
        raise ValueError(
            f"nnodes={nnodes} needs rdzv_endpoint='host:port' (the c10d rendezvous every node joins), "
            "e.g. rdzv_endpoint='10.0.0.1:29400'"
        )
    host, sep, port = rdzv_endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"rdzv_endpoint {rdzv_endpoint!r} is not 'host:port'; e.g. rdzv_endpoint='10.0.0.1:29400'")
    return rdzv_endpoint


def ddp(
    script: str,
    *,
    source: str = ".",
    nproc_per_node: int | tuple[int, int] = 2,
    nnodes: int = 1,
    script_args: str = "",
    env: dict[str, str] | None = None,
    rdzv_endpoint: str | None = None,
    node_rank: int | None = None,
    rdzv_id: str | None = None,
) -> CommandWorkload:
    """A ``coordinated`` workload running ``script`` under torchrun with ``nproc_per_node``
    ranks on each of ``nnodes`` nodes. ``nproc_per_node=(min, max)`` on one node is an elastic
    run (``CommandWorkload.ranks``): ``flash.submit`` starts it with the ranks available, up to
    ``max``, and relaunches it on those left, down to ``min``, when one is lost for good."""
    if nnodes < 1:
        raise ValueError(f"nnodes={nnodes} must be >= 1 (1 for a single machine)")
    ranks: tuple[int, int] | None = None
    if isinstance(nproc_per_node, tuple):
        if nnodes != 1:
            raise ValueError(f"nproc_per_node={nproc_per_node} (elastic) is for one machine, and nnodes={nnodes}: "
                             "give each node a fixed nproc_per_node")
        if len(nproc_per_node) != 2 or not 1 <= nproc_per_node[0] <= nproc_per_node[1]:
            raise ValueError(f"nproc_per_node={nproc_per_node} must be (min, max) with 1 <= min <= max, e.g. (1, 2)")
        ranks = (int(nproc_per_node[0]), int(nproc_per_node[1]))
        nproc_per_node = ranks[1]
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node} must be >= 1")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ValueError(
            f"node_rank={node_rank} must satisfy 0 <= node_rank < nnodes={nnodes}, or be None to let the c10d "
            "rendezvous assign ranks"
        )
    argv = ["torchrun", f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}"]
    if nnodes == 1:
        argv += ["--standalone", "--local-addr=127.0.0.1"]
    else:
        endpoint = _check_endpoint(rdzv_endpoint, nnodes)
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id or 'flashruntime'}"]
        if node_rank is not None:
            argv.append(f"--node-rank={node_rank}")
    argv += [script, *shlex.split(script_args)]
    return CommandWorkload(
        command=argv,
        source=Source(path=source),
        env=dict(env or {}),
        outputs=OutputSpec(collect=["metrics.json"]),
        mode="coordinated",
        checkpoint=CheckpointPolicy(backend="local_manifest", note=_CHECKPOINT_NOTE),
        ranks=ranks,
    )
