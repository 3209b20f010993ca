"""The profiling contract: a ``Profiler`` measures a few real steps of a command and answers
a ``ProfileResult``; a ``ProfileCache`` keeps results under a key made of everything that
determines the numbers (``profile_key``), so an unchanged setup is measured once.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from flashruntime.protocol.profile_v1alpha1 import ProfileResult

if TYPE_CHECKING:
    from flashruntime.protocol.plan_v1alpha1 import PlanRequest, StrategyPlan

__all__ = ["ProfileCache", "Profiler", "framework_versions", "profile_key", "profile_key_fields"]


class Profiler(ABC):
    """Measures a bounded handful of real steps of a run."""

    @abstractmethod
    def profile(
        self, request: PlanRequest | None, plan: StrategyPlan | None, budget_seconds: float = 300.0
    ) -> ProfileResult:
        """Measure the run ``plan`` describes for ``request`` within ``budget_seconds`` of wall
        clock; raises ``ProfileError`` when it hangs, crashes or measures nothing."""


@runtime_checkable
class ProfileCache(Protocol):
    """Profile results by key (``profile_key``)."""

    def get(self, key: str) -> ProfileResult | None:
        """The result stored under ``key``, None when there is none."""

    def put(self, key: str, result: ProfileResult) -> None:
        """Store ``result`` under ``key``, replacing what was there."""


def framework_versions() -> dict[str, str]:
    """Installed versions of the frameworks a measurement depends on (read from package
    metadata, so nothing is imported); a missing one is ``"absent"``."""
    found: dict[str, str] = {}
    for name in ("flashruntime", "torch"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def _bucket(value: int | None) -> int | None:
    """The power of two at or above ``value``: 1500 and 2048 tokens share a bucket."""
    if value is None or value < 1:
        return value
    return 2 ** math.ceil(math.log2(value))


def profile_key_fields(
    request: PlanRequest | None, plan: StrategyPlan | None, command: str, versions: dict[str, str] | None = None
) -> dict[str, Any]:
    """What determines a measurement: the command, the model, the strategy and its knobs, the
    GPU class, framework versions, and the sequence length and micro-batch in power-of-two buckets."""
    workload = None if request is None else request.workload
    resources = None if request is None else request.resources
    return {
        "command": command,
        "model": getattr(workload, "model", getattr(workload, "kind", None)),
        "parameters": getattr(workload, "parameters_b", None) or getattr(workload, "parameters_m", None),
        "method": getattr(workload, "method", None),
        "precision": getattr(workload, "precision", None),
        "strategy": None if plan is None else plan.strategy_family,
        "workers": None if plan is None else plan.workers,
        "knobs": None if plan is None else {
            "quantization": plan.quantization, "peft": plan.peft, "grad_accum": plan.grad_accum,
            "activation_checkpointing": plan.activation_checkpointing, "offload": plan.offload,
        },
        "gpu_class": None if resources is None else (resources.gpu_type or resources.vram_gb),
        "seq_bucket": _bucket(getattr(workload, "seq_len", None)),
        "batch_bucket": _bucket(getattr(workload, "micro_batch_per_gpu", None)),
        "versions": framework_versions() if versions is None else versions,
    }


def profile_key(
    request: PlanRequest | None, plan: StrategyPlan | None, command: str, versions: dict[str, str] | None = None
) -> str:
    """sha256 of ``profile_key_fields`` as canonical JSON."""
    fields = profile_key_fields(request, plan, command, versions)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
