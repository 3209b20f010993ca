"""Planner wire models: the PlanRequest (workload + resources + objective) and the
PlanReport with its candidates and the selected StrategyPlan.

Field constraints only, no custom validators; every ``kind`` defaults to its literal.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from flashruntime.protocol.base import WireModel

__all__ = [
    "PLAN_API_VERSION",
    "CandidateStatus",
    "CandidateVerdict",
    "CheckpointPolicy",
    "ClassicalML",
    "Estimate",
    "EstimateBasis",
    "IndependentTasks",
    "Interconnect",
    "LibraryRef",
    "MemoryBreakdown",
    "Objective",
    "PlanReport",
    "PlanRequest",
    "PyTorchTraining",
    "Resources",
    "StrategyPlan",
    "TransformerFineTune",
    "Workload",
]

PLAN_API_VERSION = "flashml.dev/v1alpha1"

Precision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adamw", "adamw_8bit", "sgd_momentum"]


class TransformerFineTune(WireModel):
    kind: Literal["transformer_finetune"] = "transformer_finetune"
    model: str
    parameters_b: float | None = Field(default=None, gt=0)
    method: Literal["full", "lora", "qlora"] = "lora"
    lora_rank: int = Field(default=16, ge=1, le=256)
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    seq_len: int = Field(default=2048, ge=64)
    micro_batch_per_gpu: int = Field(default=1, ge=1)
    grad_accum: int = Field(default=8, ge=1)
    activation_checkpointing: bool | None = None  # None = the planner decides
    hidden_size: int | None = Field(default=None, ge=64)
    num_layers: int | None = Field(default=None, ge=1)
    train_tokens_m: float | None = Field(default=None, gt=0)


class PyTorchTraining(WireModel):
    kind: Literal["pytorch_training"] = "pytorch_training"
    model: str = "custom"
    parameters_m: float = Field(gt=0)
    trainable_fraction: float = Field(default=1.0, gt=0, le=1)
    precision: Precision = "fp32"
    optimizer: Optimizer = "adamw"
    activation_gb_per_gpu: float | None = Field(default=None, gt=0)
    est_train_gpu_hours: float | None = Field(default=None, gt=0)


class ClassicalML(WireModel):
    kind: Literal["classical_ml"] = "classical_ml"
    library: Literal["sklearn", "xgboost"] = "sklearn"
    algorithm: str = "unspecified"
    dataset_mb: float = Field(gt=0)
    supports_partial_fit: bool = False


class IndependentTasks(WireModel):
    kind: Literal["independent_tasks"] = "independent_tasks"
    task_kind: Literal["hyperparameter_search", "batch_inference", "evaluation", "preprocessing", "other"] = (
        "hyperparameter_search"
    )
    task_count: int = Field(ge=1)
    est_minutes_per_task: float = Field(default=10.0, gt=0)
    needs_gpu: bool = False
    vram_gb_per_task: float = Field(default=0.0, ge=0)


Workload = Annotated[
    Union[TransformerFineTune, PyTorchTraining, ClassicalML, IndependentTasks],
    Field(discriminator="kind"),
]

Interconnect = Literal[
    "same_host_nvlink", "same_host_pcie", "multi_node_ib", "multi_node_100g", "multi_node_10g", "wan"
]


class Resources(WireModel):
    gpus: int = Field(default=0, ge=0)
    gpu_type: str | None = None
    vram_gb: float | None = Field(default=None, gt=0)
    hosts: int = Field(default=1, ge=1)
    interconnect: Interconnect = "same_host_pcie"
    cpu_ram_gb: float = Field(default=32.0, gt=0)
    cpu_cores: int = Field(default=8, ge=1)
    hourly_cost_usd_per_gpu: float | None = Field(default=None, ge=0)


class Objective(WireModel):
    mode: Literal["cheapest", "fastest", "balanced", "reliable"] = "balanced"
    max_cost_usd: float | None = Field(default=None, gt=0)
    deadline_minutes: float | None = Field(default=None, gt=0)
    allow_quantization: bool = True
    allow_cpu_offload: bool = True
    allow_nvme_offload: bool = False


class PlanRequest(WireModel):
    apiVersion: str = PLAN_API_VERSION
    kind: Literal["PlanRequest"] = "PlanRequest"
    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    objective: Objective = Field(default_factory=Objective)


EstimateBasis = Literal["static", "profiled", "ledger"]


class Estimate(WireModel):
    value: float
    unit: str
    basis: EstimateBasis = "static"
    note: str = ""


class MemoryBreakdown(WireModel):
    weights_gb: float = 0.0
    gradients_gb: float = 0.0
    optimizer_gb: float = 0.0
    activations_gb: float = 0.0
    transient_gb: float = 0.0
    overhead_gb: float = 0.0
    total_gb: float = 0.0
    cpu_offload_gb: float = 0.0
    basis: EstimateBasis = "static"


class LibraryRef(WireModel):
    name: str
    role: str
    purpose: str = ""


CandidateStatus = Literal["selected", "feasible", "infeasible", "rejected_policy", "rejected_dominated"]


class CandidateVerdict(WireModel):
    name: str
    strategy_family: str
    workers: int
    status: CandidateStatus
    memory: MemoryBreakdown | None = None
    est_time_min: Estimate | None = None
    est_cost_usd: Estimate | None = None
    scaling_efficiency: float | None = None
    profiling_required: bool = False
    reasons: list[str] = Field(default_factory=list)


class CheckpointPolicy(WireModel):
    backend: str = "pytorch_dcp"
    interval_seconds: int = 300
    note: str = ""


class StrategyPlan(WireModel):
    apiVersion: str = PLAN_API_VERSION
    kind: Literal["StrategyPlan"] = "StrategyPlan"
    plan_id: str
    planner_version: str
    workload_mode: Literal["local", "independent_tasks", "coordinated_training"]
    strategy_family: str
    launcher: str
    workers: int = 1
    gpus_per_worker: int = 0
    colocated: bool = True
    precision: str | None = None
    quantization: str | None = None
    peft: str | None = None
    micro_batch_per_gpu: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: bool | None = None
    offload: Literal["none", "optimizer_cpu", "params_cpu", "nvme"] = "none"
    libraries: list[LibraryRef] = Field(default_factory=list)
    checkpoint: CheckpointPolicy | None = None
    memory: MemoryBreakdown | None = None
    est_time_min: Estimate | None = None
    est_cost_usd: Estimate | None = None
    scaling_efficiency: float | None = None
    profiling_required: bool = False
    selected_because: list[str] = Field(default_factory=list)


class PlanReport(WireModel):
    apiVersion: str = PLAN_API_VERSION
    kind: Literal["PlanReport"] = "PlanReport"
    planner_version: str
    request_digest: str
    selected: StrategyPlan | None = None
    candidates: list[CandidateVerdict] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    no_valid_strategy_hint: str | None = None
