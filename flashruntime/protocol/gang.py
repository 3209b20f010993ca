"""A multi-node job's tasks: one per node, all joining one torchrun rendezvous.

A ``command`` job with ``parameters.nodes = {"min": MIN, "max": MAX}`` expands into MAX
tasks, one per node, whose payload carries a ``gang``: each task runs the job's command
under ``torchrun --nnodes=MIN:MAX`` with the c10d rendezvous on the coordinator's store.
torchrun's own elastic agent then does the rest: when a node is lost the nodes left meet
again and continue once at least MIN are there; a node that comes back joins them.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from flashruntime.protocol.base import WireModel

__all__ = ["DEFAULT_LAST_CALL_S", "GANG_KEY", "MAX_GANG_NODES", "MAX_GANG_RESTARTS", "MAX_LAST_CALL_S",
           "MAX_NPROC_PER_NODE", "STORE_READY_PREFIX", "Gang"]

GANG_KEY = "gang"
STORE_READY_PREFIX = "ready "  # what flashruntime.torch.rendezvous_store prints once it serves
MAX_GANG_NODES = 64
MAX_NPROC_PER_NODE = 64
MAX_GANG_RESTARTS = 100
DEFAULT_LAST_CALL_S = 30  # torchrun's own default
KEEP_ALIVE_LAPSE_S = 15.0  # torchrun's rendezvous keep-alive: every 5 s, a node gone after 3 missed
MAX_LAST_CALL_S = 600


class Gang(WireModel):
    """``payload.gang`` of one node's task."""

    # Fields a newer coordinator adds are ignored here: the wire grows additively.
    model_config = ConfigDict(defer_build=True, extra="ignore")

    run_id: str = Field(min_length=1, max_length=64)  # the job's id
    min_nodes: int = Field(ge=1, le=MAX_GANG_NODES)
    max_nodes: int = Field(ge=1, le=MAX_GANG_NODES)
    nproc_per_node: int = Field(1, ge=1, le=MAX_NPROC_PER_NODE)
    # Membership changes cost torchrun no restart; a failure of the group's ranks (a node lost
    # mid-step) costs one, so this is how many losses the group survives within one attempt.
    max_restarts: int = Field(3, ge=0, le=MAX_GANG_RESTARTS)
    # A directory every node sees (a shared file system): FLASHML_CKPT_DIR of each node, so the
    # nodes left resume from what rank 0 wrote, wherever rank 0 ran.
    checkpoint_dir: str | None = Field(None, min_length=1, max_length=4096)
    # torchrun's last call: once MIN nodes are in, how long a rendezvous waits for more. Longer
    # starts the group whole more often; shorter continues sooner after a node is lost.
    last_call_s: int = Field(DEFAULT_LAST_CALL_S, ge=1, le=MAX_LAST_CALL_S)
    port: int | None = Field(None, ge=1, le=65535)  # the coordinator's rendezvous store, stamped at submission
    # torchrun's --rdzv-id, given with each claim: the group's the node joins. A group that ends
    # closes its rendezvous for good, so the next group of the job meets under a new id.
    rdzv_id: str | None = Field(None, min_length=1, max_length=128)

    @property
    def regroup_s(self) -> float:
        """How long the nodes left may be silent while they meet again after a loss: torchrun
        lets a lost node's keep-alives lapse (3 beats of 5 s), then waits its last call."""
        return KEEP_ALIVE_LAPSE_S + self.last_call_s

    @property
    def world_sizes(self) -> tuple[int, int]:
        """(fewest, most) ranks the group may run with."""
        return self.min_nodes * self.nproc_per_node, self.max_nodes * self.nproc_per_node
