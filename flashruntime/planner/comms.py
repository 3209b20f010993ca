"""Communication model: bytes each distribution family moves per optimizer
step, the time that takes on the interconnect, and the resulting scaling efficiency.

DDP all-reduces trainable gradients once per step; FSDP2 all-gathers parameters in
forward and backward and reduce-scatters gradients every micro-batch; ZeRO-3 offload
adds host<->device traffic. A fixed fraction of communication overlaps compute.
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner.catalog_links import INTERCONNECTS

# %-formatting renders floats exactly as the f-string specs do, in one call (hot path).
_TEXT = "scaling efficiency %.2f: %.2f s communication per step (%s), %.2f s exposed vs %.1f s compute"
_NO_COMMUNICATION = "no inter-GPU communication"
# " over <link> (<GB/s> GB/s)" per interconnect, derived once from the catalog.
_LINK_TEXT = {name: f" over {name} ({bandwidth / 1e9:g} GB/s)" for name, (bandwidth, _) in INTERCONNECTS.items()}


class Link:
    """One interconnect: its catalog bandwidth and latency, and how the sentences name it."""

    __slots__ = ("bandwidth", "latency", "suffix")

    def __init__(self, interconnect: str) -> None:
        self.bandwidth, self.latency = INTERCONNECTS[interconnect]
        self.suffix = _LINK_TEXT[interconnect]

    def step(
        self,
        compute_seconds: float,
        family: str,
        workers: int,
        grad_bytes: float,
        param_bytes: float,
        micro_batches: int,
        layers: int,
        host_bytes: float = 0.0,
        grad_text: str | None = None,
    ) -> tuple[float, str]:
        """Scaling efficiency of one rank whose optimizer step computes for ``compute_seconds``, and the
        sentence with its arithmetic: seconds of communication per step, how much of it is exposed, over
        which link.

        ``grad_bytes``: trainable gradients, full size; ``param_bytes``: all parameters as stored on the GPU,
        full size (gathered by sharded families); ``host_bytes``: ZeRO-Offload host<->device bytes of this
        rank; ``grad_text``: ``mb_text(grad_bytes)`` when the caller already has it.
        """
        w = workers
        if w <= 1:
            efficiency = scaling_efficiency(compute_seconds, 0.0)
            return efficiency, _TEXT % (efficiency, 0.0, _NO_COMMUNICATION, 0.0, compute_seconds)
        latency = self.latency
        share = (w - 1) / w
        if grad_text is None:
            grad_text = mb_text(grad_bytes)
        if family == "ddp":
            volume = K.ALLREDUCE_FACTOR * share * grad_bytes
            buckets = max(1, math.ceil(grad_bytes / K.DDP_BUCKET_BYTES)) if math.isfinite(grad_bytes) else grad_bytes
            lat = float(buckets) * K.ALLREDUCE_FACTOR * (w - 1) * latency
            what = f"ring all-reduce of {grad_text} gradients"
        else:
            per_micro = 2 * share * param_bytes + share * grad_bytes
            volume = per_micro * micro_batches
            lat = float(micro_batches) * K.FSDP_COLLECTIVES_PER_LAYER * layers * (w - 1) * latency
            what = (
                f"all-gather {mb_text(param_bytes)} parameters twice + reduce-scatter {grad_text} gradients "
                f"x {micro_batches} micro-batches"
            )
        seconds = volume / self.bandwidth + lat
        if host_bytes:
            seconds += host_bytes / K.PCIE4_X16_BYTES_PER_S
            what += f" + {mb_text(host_bytes)} host<->GPU over PCIe 4.0"
        exposed = seconds * (1 - K.COMM_OVERLAP_FRACTION)
        efficiency = scaling_efficiency(compute_seconds, exposed)
        return efficiency, _TEXT % (efficiency, seconds, what + self.suffix, exposed, compute_seconds)


def scaling_efficiency(compute_seconds: float, exposed_seconds: float) -> float:
    """compute / (compute + exposed communication), 1.0 with nothing exposed."""
    if compute_seconds <= 0:
        return 1.0
    return compute_seconds / (compute_seconds + exposed_seconds)


def mb_text(n: float) -> str:
    """A byte count as the communication sentences show it (GB from 1e9, else MB)."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB"
