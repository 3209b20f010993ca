"""Planner requests shared by the planner tests: the reference request and one request
per workload kind x objective mode for the golden files."""

from __future__ import annotations

from typing import Any

MODES = ("balanced", "cheapest", "fastest", "reliable")

# The reference request (examples/plan-qwen7b-lora.yaml).
SANITY_REQUEST: dict[str, Any] = {
    "workload": {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "lora", "train_tokens_m": 25},
    "resources": {"gpus": 4, "gpu_type": "RTX4090", "hourly_cost_usd_per_gpu": 0.44},
    "objective": {"mode": "balanced", "max_cost_usd": 20, "deadline_minutes": 240},
}

_BASE: dict[str, dict[str, Any]] = {
    "transformer_finetune": {
        "workload": SANITY_REQUEST["workload"],
        "resources": SANITY_REQUEST["resources"],
        "objective": {"max_cost_usd": 20, "deadline_minutes": 240},
    },
    "pytorch_training": {
        "workload": {"kind": "pytorch_training", "model": "resnet152", "parameters_m": 60.2,
                     "precision": "fp32", "activation_gb_per_gpu": 9.0, "est_train_gpu_hours": 12},
        "resources": {"gpus": 8, "gpu_type": "a10", "hourly_cost_usd_per_gpu": 0.75},
        "objective": {"deadline_minutes": 240},
    },
    "classical_ml": {
        "workload": {"kind": "classical_ml", "library": "sklearn", "algorithm": "SGDClassifier",
                     "dataset_mb": 12000, "supports_partial_fit": True},
        "resources": {"hosts": 4, "cpu_ram_gb": 32, "cpu_cores": 16},
        "objective": {},
    },
    "independent_tasks": {
        "workload": {"kind": "independent_tasks", "task_kind": "hyperparameter_search", "task_count": 40,
                     "est_minutes_per_task": 12, "needs_gpu": True, "vram_gb_per_task": 10},
        "resources": {"gpus": 6, "gpu_type": "l4", "hourly_cost_usd_per_gpu": 0.8},
        "objective": {"max_cost_usd": 80},
    },
}

# Extra cases: with no valid strategy, one per way of failing; a CPU-only request.
_EXTRA: dict[str, dict[str, Any]] = {
    "transformer_finetune-no_valid_strategy": {
        "workload": {"kind": "transformer_finetune", "model": "meta-llama/Llama-3.1-70B", "method": "full",
                     "train_tokens_m": 10},
        "resources": {"gpus": 2, "gpu_type": "rtx4090", "hourly_cost_usd_per_gpu": 0.44},
        "objective": {"mode": "balanced"},
    },
    "pytorch_training-cpu": {
        "workload": {"kind": "pytorch_training", "model": "mlp", "parameters_m": 120, "precision": "fp32",
                     "optimizer": "adamw", "activation_gb_per_gpu": 1.5},
        "resources": {"gpus": 0, "cpu_cores": 6, "cpu_ram_gb": 16},
        "objective": {"mode": "balanced"},
    },
    "independent_tasks-no_valid_strategy": {
        "workload": {"kind": "independent_tasks", "task_count": 10, "needs_gpu": True, "vram_gb_per_task": 40},
        "resources": {"gpus": 2, "gpu_type": "a10"},
        "objective": {"mode": "fastest"},
    },
}


def golden_cases() -> dict[str, dict[str, Any]]:
    """name -> PlanRequest dict, one per workload kind x objective mode, plus the no-valid-strategy cases."""
    cases: dict[str, dict[str, Any]] = {}
    for kind, base in _BASE.items():
        for mode in MODES:
            objective = {**base["objective"], "mode": mode}
            cases[f"{kind}-{mode}"] = {**base, "objective": objective}
    cases.update(_EXTRA)
    return cases
