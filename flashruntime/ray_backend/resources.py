"""A task's placement gates as Ray resources. Pure.

| gate | on Ray |
|---|---|
| ``gpus: N`` | ``num_gpus=N`` (Ray sets ``CUDA_VISIBLE_DEVICES``) |
| ``pool: P`` | the custom resource ``pool:P`` (a node joins a pool with ``ray start --resources '{"pool:P": 1000}'``) |
| ``local_inputs: [D]`` | the custom resource ``dataset:D``; the node's ``FLASHML_RAY_DATASETS`` says where D is |
| ``module`` / ``argv`` | run as on a trusted agent (the submitter's permission is checked at submission) |
| ``isolation`` tier other than standard | refused, unless ``allowFallback``: a Ray worker has no sandbox |
| ``exclude_nodes`` | refused: they name agent nodes, which a Ray cluster does not have |

Every task asks for one CPU. A custom resource is asked for in a small fraction
(``CUSTOM_RESOURCE_SHARE``), so that it gates placement without limiting how many tasks
share a node. ``ray_options`` says why a payload cannot run on Ray, and
``unplaceable_reason`` why no node of the cluster could take it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CUSTOM_RESOURCE_SHARE", "ray_options", "unplaceable_reason"]

CUSTOM_RESOURCE_SHARE = 0.001
_STANDARD_TIERS = (None, "", "standard")


def ray_options(payload: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the Ray task options of this payload, None) or (None, why Ray cannot honour it)."""
    isolation = payload.get("isolation")
    if isinstance(isolation, Mapping):
        tier = isolation.get("tier")
        if tier not in _STANDARD_TIERS and isolation.get("allowFallback") is not True:
            return None, (f"isolation tier {tier!r} needs a sandbox, which a Ray worker does not have; "
                          "run the job on the agent fleet (backend 'leases') or set isolation.allowFallback")
    elif isolation is not None:
        return None, f"isolation must be an object, got {isolation!r}"
    if payload.get("exclude_nodes"):
        return None, ("exclude_nodes names agent nodes, which a Ray cluster does not have; drop it, or run "
                      "the job on the agent fleet (backend 'leases')")
    options: dict[str, Any] = {"num_cpus": 1}
    resources: dict[str, float] = {}
    gpus = payload.get("gpus")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            return None, f"gpus must be a whole number >= 0, got {gpus!r}"
        if gpus:
            options["num_gpus"] = gpus
    pool = payload.get("pool")
    if pool is not None:
        if not isinstance(pool, str) or not pool:
            return None, f"pool must be a non-empty name, got {pool!r}"
        resources[f"pool:{pool}"] = CUSTOM_RESOURCE_SHARE
    datasets = payload.get("local_inputs")
    if datasets is not None:
        if not isinstance(datasets, list) or not all(isinstance(name, str) and name for name in datasets):
            return None, f"local_inputs must be a list of dataset names, got {datasets!r}"
        for name in datasets:
            resources[f"dataset:{name}"] = CUSTOM_RESOURCE_SHARE
    if resources:
        options["resources"] = resources
    return options, None


def unplaceable_reason(options: Mapping[str, Any], nodes: Sequence[Mapping[str, float]]) -> str | None:
    """Why no node of ``nodes`` (each one's total Ray resources) could run a task with
    ``options``, or None when one could."""
    wanted = {"CPU": float(options.get("num_cpus", 0)), "GPU": float(options.get("num_gpus", 0)),
              **{name: float(amount) for name, amount in (options.get("resources") or {}).items()}}
    wanted = {name: amount for name, amount in wanted.items() if amount > 0}
    if any(all(node.get(name, 0.0) >= amount for name, amount in wanted.items()) for node in nodes):
        return None
    asked = ", ".join(f"{name}: {amount:g}" for name, amount in sorted(wanted.items()))
    if not nodes:
        return "the Ray cluster has no live node"
    return (f"no node of the Ray cluster has {asked} (its {len(nodes)} node(s) offer: "
            + "; ".join(", ".join(f"{name} {amount:g}" for name, amount in sorted(node.items())
                                  if not name.startswith(("node:", "memory", "object_store_memory")))
                        for node in nodes)
            + "); start a node with those resources, or ask for less (the job's spec.resources and "
            "spec.placement)")
