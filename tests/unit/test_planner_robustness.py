"""Any valid PlanRequest yields a PlanReport, never an exception: either a selected plan
or a hint; every candidate has reasons; render always works (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flashruntime.planner import plan, render
from flashruntime.planner.catalog_gpus import GPUS
from flashruntime.planner.catalog_models import MODELS
from flashruntime.protocol.plan_v1alpha1 import PlanRequest



def _opt_float(lo: float, hi: float) -> st.SearchStrategy[float | None]:
    return st.none() | st.floats(lo, hi)


finetune = st.fixed_dictionaries({
    "kind": st.just("transformer_finetune"),
    "model": st.sampled_from([*MODELS, "acme/unknown-model"]),
    "parameters_b": _opt_float(0.01, 500),
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "lora_rank": st.integers(1, 256),
    "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
    "optimizer": st.sampled_from(["adamw", "adamw_8bit", "sgd_momentum"]),
    "seq_len": st.integers(64, 32768),
    "micro_batch_per_gpu": st.integers(1, 64),
    "grad_accum": st.integers(1, 64),
    "activation_checkpointing": st.none() | st.booleans(),
    "hidden_size": st.none() | st.integers(64, 16384),
    "num_layers": st.none() | st.integers(1, 128),
    "train_tokens_m": _opt_float(0.001, 1e6),
})
pytorch = st.fixed_dictionaries({
    "kind": st.just("pytorch_training"),
    "parameters_m": st.floats(0.01, 1e5),
    "trainable_fraction": st.floats(0.001, 1.0),
    "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
    "optimizer": st.sampled_from(["adamw", "adamw_8bit", "sgd_momentum"]),
    "activation_gb_per_gpu": _opt_float(0.01, 500),
    "est_train_gpu_hours": _opt_float(0.001, 1e5),
})
classical = st.fixed_dictionaries({
    "kind": st.just("classical_ml"),
    "dataset_mb": st.floats(0.001, 1e7),
    "supports_partial_fit": st.booleans(),
})
tasks = st.fixed_dictionaries({
    "kind": st.just("independent_tasks"),
    "task_count": st.integers(1, 100_000),
    "est_minutes_per_task": st.floats(0.001, 1e4),
    "needs_gpu": st.booleans(),
    "vram_gb_per_task": st.floats(0, 200),
})
resources = st.fixed_dictionaries({
    "gpus": st.integers(0, 64),
    "gpu_type": st.none() | st.sampled_from([*GPUS, "mystery-gpu"]),
    "vram_gb": _opt_float(0.5, 200),
    "hosts": st.integers(1, 16),
    "interconnect": st.sampled_from(["same_host_nvlink", "same_host_pcie", "multi_node_ib", "multi_node_100g",
                                     "multi_node_10g", "wan"]),
    "cpu_ram_gb": st.floats(0.5, 4096),
    "cpu_cores": st.integers(1, 256),
    "hourly_cost_usd_per_gpu": _opt_float(0, 50),
})
objective = st.fixed_dictionaries({
    "mode": st.sampled_from(["cheapest", "fastest", "balanced", "reliable"]),
    "max_cost_usd": _opt_float(0.01, 1e5),
    "deadline_minutes": _opt_float(0.01, 1e6),
    "allow_quantization": st.booleans(),
    "allow_cpu_offload": st.booleans(),
})


@settings(max_examples=150, deadline=None)
@given(workload=st.one_of(finetune, pytorch, classical, tasks), resources=resources, objective=objective)
def test_any_valid_request_gives_a_report(workload: dict[str, Any], resources: dict[str, Any],
                                          objective: dict[str, Any]) -> None:
    request = PlanRequest.model_validate({"workload": workload, "resources": resources, "objective": objective})
    report = plan(request)
    assert (report.selected is None) == (report.no_valid_strategy_hint is not None)
    statuses = [c.status for c in report.candidates]
    assert statuses.count("selected") == (0 if report.selected is None else 1)
    for c in report.candidates:
        assert c.reasons
        if c.memory is not None:
            assert c.memory.total_gb > 0
    text = render(report)
    assert text.endswith(f"request {report.request_digest}\n")
