"""Communication model (SPEC §7.2): bytes each distribution family moves per optimizer
step, the time that takes on the interconnect, and the resulting scaling efficiency.

DDP all-reduces trainable gradients once per step; FSDP2 all-gathers parameters in
forward and backward and reduce-scatters gradients every micro-batch; ZeRO-3 offload
adds host<->device traffic. A fixed fraction of communication overlaps compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashruntime.planner import constants as K
from flashruntime.planner.catalog_links import INTERCONNECTS


@dataclass(frozen=True)
class StepTraffic:
    """What one optimizer step of one rank communicates."""

    family: str
    workers: int
    interconnect: str
    grad_bytes: float  # trainable gradients, full size
    param_bytes: float  # all parameters as stored on the GPU, full size (gathered by sharded families)
    micro_batches: int
    layers: int
    host_bytes: float = 0.0  # ZeRO-Offload host<->device bytes of this rank


@dataclass(frozen=True)
class CommEstimate:
    seconds: float  # total communication time per step
    exposed_seconds: float  # the part not hidden behind compute
    volume_bytes: float  # network bytes per step per rank
    description: str


def step_communication(traffic: StepTraffic) -> CommEstimate:
    """Seconds of communication per optimizer step for one rank, and how much of it is exposed."""
    w = traffic.workers
    if w <= 1:
        return CommEstimate(0.0, 0.0, 0.0, "no inter-GPU communication")
    bandwidth, latency = INTERCONNECTS[traffic.interconnect]
    share = (w - 1) / w
    if traffic.family == "ddp":
        volume = K.ALLREDUCE_FACTOR * share * traffic.grad_bytes
        buckets = max(1, math.ceil(traffic.grad_bytes / K.DDP_BUCKET_BYTES))
        lat = buckets * K.ALLREDUCE_FACTOR * (w - 1) * latency
        what = f"ring all-reduce of {_mb(traffic.grad_bytes)} gradients"
    else:
        per_micro = 2 * share * traffic.param_bytes + share * traffic.grad_bytes
        volume = per_micro * traffic.micro_batches
        lat = traffic.micro_batches * K.FSDP_COLLECTIVES_PER_LAYER * traffic.layers * (w - 1) * latency
        what = (
            f"all-gather {_mb(traffic.param_bytes)} parameters twice + reduce-scatter {_mb(traffic.grad_bytes)} "
            f"gradients x {traffic.micro_batches} micro-batches"
        )
    seconds = volume / bandwidth + lat
    if traffic.host_bytes:
        seconds += traffic.host_bytes / K.PCIE4_X16_BYTES_PER_S
        what += f" + {_mb(traffic.host_bytes)} host<->GPU over PCIe 4.0"
    exposed = seconds * (1 - K.COMM_OVERLAP_FRACTION)
    description = f"{what} over {traffic.interconnect} ({bandwidth / 1e9:g} GB/s)"
    return CommEstimate(seconds, exposed, volume, description)


def scaling_efficiency(compute_seconds: float, comm: CommEstimate) -> float:
    """compute / (compute + exposed communication), 1.0 with nothing exposed."""
    if compute_seconds <= 0:
        return 1.0
    return compute_seconds / (compute_seconds + comm.exposed_seconds)


def _mb(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB"
