"""World sizes a menu considers and how a world of GPUs spreads over hosts.

W ∈ {1} ∪ {powers of two below ``gpus``} ∪ {``gpus``}; GPUs are spread evenly over
``hosts``, so the busiest host carries ⌈gpus / hosts⌉ of them at most.
"""

from __future__ import annotations

import math

from flashruntime.protocol.plan_v1alpha1 import Resources


def world_sizes(gpus: int) -> list[int]:
    """1, every power of two below ``gpus``, and ``gpus`` itself (ascending, no duplicates)."""
    if gpus < 1:
        return []
    sizes = {1, gpus}
    power = 2
    while power < gpus:
        sizes.add(power)
        power *= 2
    return sorted(sizes)


def fits_one_host(workers: int, res: Resources) -> bool:
    """Whether ``workers`` GPUs fit on one host (the plan is colocated)."""
    return res.hosts == 1 or workers <= max(1, math.ceil(res.gpus / res.hosts))


def same_host_link_warning(res: Resources) -> str | None:
    """A note when several hosts are declared but the interconnect is a same-host one."""
    if res.hosts > 1 and res.interconnect.startswith("same_host"):
        return (
            f"resources.hosts = {res.hosts} but interconnect = {res.interconnect}: traffic between hosts is modelled "
            f"at same-host speed; set interconnect to the network between them (e.g. multi_node_100g)"
        )
    return None


def gpus_on_busiest_host(workers: int, res: Resources) -> int:
    """GPUs of a ``workers``-wide job on its most loaded host (they share that host's RAM and memory bus)."""
    per_host = max(1, math.ceil(res.gpus / res.hosts)) if res.gpus else 1
    return max(1, min(workers, per_host))
