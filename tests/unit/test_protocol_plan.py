"""Planner wire models: constraints, discriminated workload, round trips."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from flashruntime.protocol import plan_v1alpha1 as pp

SANITY_REQUEST = {
    "workload": {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "lora", "train_tokens_m": 25},
    "resources": {"gpus": 4, "gpu_type": "RTX4090", "hourly_cost_usd_per_gpu": 0.44},
    "objective": {"mode": "balanced", "max_cost_usd": 20, "deadline_minutes": 240},
}


def test_request_parses_and_round_trips() -> None:
    request = pp.PlanRequest.model_validate(SANITY_REQUEST)
    assert isinstance(request.workload, pp.TransformerFineTune)
    assert request.apiVersion == pp.PLAN_API_VERSION == "flashml.dev/v1alpha1" and request.kind == "PlanRequest"
    assert pp.PlanRequest.model_validate_json(request.model_dump_json()) == request


@pytest.mark.parametrize("workload, cls", [
    ({"kind": "transformer_finetune", "model": "gpt2"}, pp.TransformerFineTune),
    ({"kind": "pytorch_training", "parameters_m": 25}, pp.PyTorchTraining),
    ({"kind": "classical_ml", "dataset_mb": 100}, pp.ClassicalML),
    ({"kind": "independent_tasks", "task_count": 8}, pp.IndependentTasks),
])
def test_workload_union_dispatches_on_kind(workload: dict, cls: type) -> None:
    request = pp.PlanRequest.model_validate({"workload": workload})
    assert type(request.workload) is cls
    assert pp.PlanRequest.model_validate_json(request.model_dump_json()).workload == request.workload


def test_kind_defaults_to_its_literal() -> None:
    assert pp.TransformerFineTune(model="m").kind == "transformer_finetune"
    assert pp.PyTorchTraining(parameters_m=1).kind == "pytorch_training"
    assert pp.ClassicalML(dataset_mb=1).kind == "classical_ml"
    assert pp.IndependentTasks(task_count=1).kind == "independent_tasks"


def test_defaults() -> None:
    ft = pp.TransformerFineTune(model="m")
    assert (ft.method, ft.lora_rank, ft.precision, ft.optimizer, ft.seq_len, ft.micro_batch_per_gpu, ft.grad_accum) == (
        "lora", 16, "bf16", "adamw", 2048, 1, 8
    )
    assert ft.activation_checkpointing is None and ft.parameters_b is None and ft.train_tokens_m is None
    pt = pp.PyTorchTraining(parameters_m=3)
    assert (pt.model, pt.trainable_fraction, pt.precision, pt.optimizer) == ("custom", 1.0, "fp32", "adamw")
    res = pp.Resources()
    assert (res.gpus, res.gpu_type, res.vram_gb, res.hosts, res.interconnect, res.cpu_ram_gb, res.cpu_cores) == (
        0, None, None, 1, "same_host_pcie", 32.0, 8
    )
    obj = pp.Objective()
    assert (obj.mode, obj.allow_quantization, obj.allow_cpu_offload, obj.allow_nvme_offload) == (
        "balanced", True, True, False
    )
    it = pp.IndependentTasks(task_count=2)
    assert (it.task_kind, it.est_minutes_per_task, it.needs_gpu, it.vram_gb_per_task) == (
        "hyperparameter_search", 10.0, False, 0.0
    )


@pytest.mark.parametrize("model, data", [
    (pp.TransformerFineTune, {"model": "m", "parameters_b": 0}),
    (pp.TransformerFineTune, {"model": "m", "lora_rank": 0}),
    (pp.TransformerFineTune, {"model": "m", "lora_rank": 257}),
    (pp.TransformerFineTune, {"model": "m", "seq_len": 63}),
    (pp.TransformerFineTune, {"model": "m", "hidden_size": 32}),
    (pp.TransformerFineTune, {"model": "m", "num_layers": 0}),
    (pp.TransformerFineTune, {"model": "m", "method": "prefix"}),
    (pp.TransformerFineTune, {"model": "m", "train_tokens_m": 0}),
    (pp.PyTorchTraining, {"parameters_m": 0}),
    (pp.PyTorchTraining, {"parameters_m": 1, "trainable_fraction": 0}),
    (pp.PyTorchTraining, {"parameters_m": 1, "trainable_fraction": 1.5}),
    (pp.ClassicalML, {"dataset_mb": 0}),
    (pp.ClassicalML, {"dataset_mb": 1, "library": "lightgbm"}),
    (pp.IndependentTasks, {"task_count": 0}),
    (pp.IndependentTasks, {"task_count": 1, "vram_gb_per_task": -1}),
    (pp.Resources, {"gpus": -1}),
    (pp.Resources, {"vram_gb": 0}),
    (pp.Resources, {"hosts": 0}),
    (pp.Resources, {"interconnect": "carrier_pigeon"}),
    (pp.Resources, {"hourly_cost_usd_per_gpu": -0.1}),
    (pp.Objective, {"mode": "fancy"}),
    (pp.Objective, {"max_cost_usd": 0}),
    (pp.Objective, {"deadline_minutes": -5}),
])
def test_constraints_reject(model: type[BaseModel], data: dict) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(data)


def test_accepts_boundaries() -> None:
    assert pp.TransformerFineTune(model="m", lora_rank=256, seq_len=64, hidden_size=64).lora_rank == 256
    assert pp.PyTorchTraining(parameters_m=1, trainable_fraction=1.0).trainable_fraction == 1.0
    assert pp.Resources(hourly_cost_usd_per_gpu=0).hourly_cost_usd_per_gpu == 0


def test_missing_or_unknown_kind_is_refused() -> None:
    with pytest.raises(ValidationError):
        pp.PlanRequest.model_validate({"workload": {"model": "gpt2"}})
    with pytest.raises(ValidationError):
        pp.PlanRequest.model_validate({"workload": {"kind": "rl", "model": "gpt2"}})


def test_report_models_round_trip_and_ignore_unknown_fields() -> None:
    memory = pp.MemoryBreakdown(weights_gb=1.5, total_gb=3.0)
    plan = pp.StrategyPlan(
        plan_id="pl_x", planner_version="0.1.0", workload_mode="coordinated_training", strategy_family="ddp",
        launcher="torchrun", workers=4, libraries=[pp.LibraryRef(name="torch", role="launcher")],
        checkpoint=pp.CheckpointPolicy(), memory=memory,
        est_time_min=pp.Estimate(value=90, unit="min"), selected_because=["cheapest"],
    )
    report = pp.PlanReport(
        planner_version="0.1.0", request_digest="0123456789abcdef", selected=plan,
        candidates=[pp.CandidateVerdict(name="ddp_x4", strategy_family="ddp", workers=4, status="selected")],
    )
    data = json.loads(report.model_dump_json())
    data["from_the_future"] = 1
    data["selected"]["new_knob"] = True
    again = pp.PlanReport.model_validate(data)
    assert again == report
    assert again.selected is not None and again.selected.offload == "none" and again.selected.colocated is True
    assert again.selected.checkpoint == pp.CheckpointPolicy(backend="pytorch_dcp", interval_seconds=300, note="")
    assert memory.basis == "static" and pp.Estimate(value=1, unit="s").basis == "static"
    with pytest.raises(ValidationError):
        pp.CandidateVerdict(name="x", strategy_family="ddp", workers=1, status="maybe")
    with pytest.raises(ValidationError):
        pp.StrategyPlan(**{**plan.model_dump(), "offload": "disk"})
