"""Candidate menus: world sizes, families and variants per workload kind,
the activation-checkpointing rule, the communication-bound threshold, host-RAM limits,
task slots and the objective's cost and deadline constraints."""

from __future__ import annotations

from typing import Any

import pytest

from flashruntime.planner import plan
from flashruntime.planner.menu_classical import shard_workers
from flashruntime.planner.topology import world_sizes
from flashruntime.protocol.plan_v1alpha1 import PlanReport, PlanRequest

LORA_7B = {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "lora", "train_tokens_m": 25}
FOUR_4090 = {"gpus": 4, "gpu_type": "rtx4090", "hourly_cost_usd_per_gpu": 0.44}


def _plan(workload: dict[str, Any], resources: dict[str, Any], objective: dict[str, Any] | None = None) -> PlanReport:
    return plan(PlanRequest.model_validate({"workload": workload, "resources": resources,
                                            "objective": objective or {}}))


def _status(report: PlanReport) -> dict[str, str]:
    return {c.name: c.status for c in report.candidates}


@pytest.mark.parametrize(("gpus", "sizes"), [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]),
                                             (8, [1, 2, 4, 8]), (12, [1, 2, 4, 8, 12])])
def test_world_sizes(gpus: int, sizes: list[int]) -> None:
    assert world_sizes(gpus) == sizes


def test_lora_menu_has_every_family_and_qlora_variants() -> None:
    names = {c.name.split("+")[0] for c in _plan(LORA_7B, FOUR_4090).candidates}
    assert names == {
        "single_gpu", "ddp_x2", "fsdp2_x2", "zero3_cpu_offload_x2", "ddp_x4", "fsdp2_x4", "zero3_cpu_offload_x4",
        "qlora_single_gpu", "qlora_ddp_x2", "qlora_zero3_cpu_offload_x2", "qlora_ddp_x4", "qlora_zero3_cpu_offload_x4",
    }


def test_objective_flags_remove_quantised_and_offloaded_candidates() -> None:
    report = _plan(LORA_7B, FOUR_4090, {"allow_quantization": False, "allow_cpu_offload": False})
    names = {c.name.split("+")[0] for c in report.candidates}
    assert names == {"single_gpu", "ddp_x2", "fsdp2_x2", "ddp_x4", "fsdp2_x4"}


def test_qlora_request_has_no_fsdp2_and_no_prefix() -> None:
    report = _plan({**LORA_7B, "method": "qlora"}, FOUR_4090)
    names = {c.name.split("+")[0] for c in report.candidates}
    assert names == {"single_gpu", "ddp_x2", "zero3_cpu_offload_x2", "ddp_x4", "zero3_cpu_offload_x4"}
    assert report.selected is not None and report.selected.quantization == "nf4"


def test_qlora_request_with_quantization_disallowed_is_rejected_by_policy() -> None:
    report = _plan({**LORA_7B, "method": "qlora"}, FOUR_4090, {"allow_quantization": False})
    assert report.selected is None
    assert all(c.status in ("rejected_policy", "infeasible") for c in report.candidates)
    assert all(any("allow_quantization is false" in r for r in c.reasons) for c in report.candidates)


def test_activation_checkpointing_only_when_it_makes_the_fit() -> None:
    small = _plan({**LORA_7B, "model": "Qwen/Qwen2.5-0.5B", "seq_len": 512}, FOUR_4090)
    assert all("+ackpt" not in c.name for c in small.candidates)
    assert small.selected is not None and small.selected.activation_checkpointing is False
    big = _plan(LORA_7B, FOUR_4090)
    assert _status(big)["ddp_x4+ackpt"] == "selected"


def test_forced_activation_checkpointing_has_no_suffix() -> None:
    off = _plan({**LORA_7B, "activation_checkpointing": False}, FOUR_4090)
    assert all("+ackpt" not in c.name for c in off.candidates)
    assert _status(off)["ddp_x4"] == "infeasible"  # 46 GB of activations-heavy replicas on 24 GB cards
    on = _plan({**LORA_7B, "activation_checkpointing": True}, FOUR_4090)
    assert _status(on)["ddp_x4"] == "selected"


def test_communication_bound_candidates_are_infeasible() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-0.5B", "method": "full",
                    "train_tokens_m": 10},
                   {"gpus": 4, "gpu_type": "a100-80gb", "hosts": 4, "interconnect": "wan"})
    ddp = next(c for c in report.candidates if c.name.startswith("ddp_x4"))
    assert ddp.status == "infeasible" and ddp.scaling_efficiency is not None and ddp.scaling_efficiency < 0.5
    assert any(r.startswith("communication-bound: scaling efficiency") for r in ddp.reasons)
    assert report.selected is not None and report.selected.strategy_family == "single_gpu"


def test_offloaded_states_must_fit_80_percent_of_host_ram() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "full"},
                   {"gpus": 4, "gpu_type": "rtx4090", "cpu_ram_gb": 64})
    zero3 = next(c for c in report.candidates if c.name.startswith("zero3_cpu_offload_x4"))
    assert zero3.status == "infeasible"
    assert any("> 0.80 x 64 GB host RAM = 51.2 GB" in r for r in zero3.reasons)
    roomy = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "full"},
                  {"gpus": 4, "gpu_type": "rtx4090", "cpu_ram_gb": 256})
    assert _status(roomy)["zero3_cpu_offload_x4+ackpt"] in ("selected", "feasible")


def test_qlora_with_quantization_disallowed_hints_at_the_switch() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "gpt2", "method": "qlora"},
                   {"gpus": 2, "gpu_type": "h100"}, {"allow_quantization": False})
    assert set(_status(report).values()) == {"rejected_policy"}
    assert report.no_valid_strategy_hint == (
        "no valid strategy: the nearest miss is single_gpu (rejected_policy): method 'qlora' quantises the base "
        "model, but objective.allow_quantization is false; set objective.allow_quantization true or use method "
        "'lora'"
    )


TASKS_3X = {"kind": "independent_tasks", "task_count": 3, "est_minutes_per_task": 4.9996}  # 2 waves: 9.9992 min


@pytest.mark.parametrize(("deadline", "status"), [(9.9995, "selected"), (9.9992, "selected"),
                                                  (9.99915, "rejected_policy")])
def test_deadline_compares_the_exact_time_not_the_rounded_one(deadline: float, status: str) -> None:
    report = _plan(TASKS_3X, {}, {"deadline_minutes": deadline})
    leased = next(c for c in report.candidates if c.name == "lease_tasks")
    assert leased.est_time_min is not None and leased.est_time_min.value == 10.0  # shown rounded
    assert leased.status == status
    if status == "rejected_policy":
        assert "time 10 min > deadline 9.99915 min" in leased.reasons
        assert report.no_valid_strategy_hint is not None
        assert report.no_valid_strategy_hint.endswith("deadline_minutes >= 10 would admit it")


def test_float_noise_is_not_over_a_limit() -> None:
    # 3 x 0.1 min = 0.30000000000000004 min meets a 0.3 min deadline
    report = _plan({"kind": "independent_tasks", "task_count": 3, "est_minutes_per_task": 0.1}, {"cpu_cores": 4},
                   {"deadline_minutes": 0.3})
    assert report.selected is not None


def test_budget_compares_the_exact_cost_and_the_fix_admits_it() -> None:
    # 60 min on one GPU at $1.004/h: shown as $1.00, but over a $1 budget
    workload = {"kind": "independent_tasks", "task_count": 1, "est_minutes_per_task": 60, "needs_gpu": True}
    report = _plan(workload, {"gpus": 1, "hourly_cost_usd_per_gpu": 1.004}, {"max_cost_usd": 1})
    assert report.selected is None
    leased = next(c for c in report.candidates if c.name == "lease_tasks")
    assert leased.est_cost_usd is not None and leased.est_cost_usd.value == 1.0
    assert "cost $1.004 > max_cost_usd $1" in leased.reasons
    assert (report.no_valid_strategy_hint or "").endswith("max_cost_usd >= 1.01 would admit it")
    assert _plan(workload, {"gpus": 1, "hourly_cost_usd_per_gpu": 1.004}, {"max_cost_usd": 1.01}).selected


def test_cost_and_deadline_constraints_reject_by_policy() -> None:
    report = _plan(LORA_7B, FOUR_4090, {"max_cost_usd": 2.5})
    assert report.selected is None
    assert all(c.status in ("rejected_policy", "infeasible") for c in report.candidates)
    hint = report.no_valid_strategy_hint or ""
    assert "nearest miss is" in hint and "max_cost_usd >= " in hint


def test_no_price_no_cost_and_no_tokens_no_time() -> None:
    report = _plan({**LORA_7B, "train_tokens_m": None}, {"gpus": 2, "gpu_type": "a100-80gb"})
    assert report.selected is not None
    assert report.selected.est_time_min is None and report.selected.est_cost_usd is None
    assert "workload.train_tokens_m not set: no time or cost estimates" in report.warnings


def test_no_valid_strategy_names_the_nearest_miss_and_a_fix() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "meta-llama/Llama-3.1-70B", "method": "full"},
                   {"gpus": 2, "gpu_type": "rtx4090"})
    assert report.selected is None
    hint = report.no_valid_strategy_hint or ""
    assert hint.startswith("no valid strategy: the nearest miss is fsdp2_x2 (infeasible): memory ")
    assert "it needs GPUs with >= " in hint and "such GPUs with fsdp2" in hint


def test_pytorch_menu_and_default_activations() -> None:
    report = _plan({"kind": "pytorch_training", "parameters_m": 50, "est_train_gpu_hours": 4},
                   {"gpus": 2, "gpu_type": "t4", "hourly_cost_usd_per_gpu": 0.35})
    assert [c.name for c in report.candidates] == ["single_gpu", "ddp_x2", "fsdp2_x2"]
    assert all(c.memory is not None and c.memory.activations_gb == 2.0 for c in report.candidates)
    assert any("activation_gb_per_gpu not set" in w for w in report.warnings)
    times = {c.name: c.est_time_min.value for c in report.candidates if c.est_time_min}
    assert times == {"single_gpu": 240.0, "ddp_x2": 120.0, "fsdp2_x2": 120.0}


@pytest.mark.parametrize(("mb", "workers"), [(100, 2), (999, 2), (1500, 3), (5000, 10), (12000, 16)])
def test_shard_workers(mb: float, workers: int) -> None:
    assert shard_workers(mb) == workers


@pytest.mark.parametrize(("dataset_mb", "ram_gb", "status"), [(8000, 32, "selected"), (9000, 32, "infeasible")])
def test_local_process_fits_iff_three_times_the_data_fits_80_percent_of_ram(
    dataset_mb: float, ram_gb: float, status: str
) -> None:
    # 3 x 8.0 GB = 24.0 <= 25.6; 3 x 9.0 GB = 27.0 > 25.6
    report = _plan({"kind": "classical_ml", "dataset_mb": dataset_mb}, {"cpu_ram_gb": ram_gb})
    assert _status(report) == {"local_process": status}


def test_partial_fit_adds_a_sharded_candidate_on_leases() -> None:
    report = _plan({"kind": "classical_ml", "dataset_mb": 2000, "supports_partial_fit": True}, {})
    assert _status(report) == {"local_process": "selected", "sharded_partial_fit": "feasible"}
    sharded = report.candidates[1]
    assert sharded.workers == 4
    big = _plan({"kind": "classical_ml", "dataset_mb": 40000, "supports_partial_fit": True}, {"hosts": 8})
    assert big.selected is not None
    assert (big.selected.strategy_family, big.selected.launcher, big.selected.workload_mode) == (
        "sharded_partial_fit", "flashruntime-leases", "independent_tasks")


def test_tasks_on_cpu_slots() -> None:
    report = _plan({"kind": "independent_tasks", "task_count": 10, "est_minutes_per_task": 5},
                   {"hosts": 2, "cpu_cores": 8})  # 2 x (8 // 4) = 4 slots -> ceil(10 / 4) = 3 waves
    lease = report.candidates[0]
    assert (lease.name, lease.status, lease.workers) == ("lease_tasks", "selected", 4)
    assert lease.est_time_min is not None and lease.est_time_min.value == 15
    assert report.candidates[1].status == "rejected_dominated"


def test_tasks_with_one_slot_run_sequentially() -> None:
    report = _plan({"kind": "independent_tasks", "task_count": 3}, {"cpu_cores": 2})
    assert _status(report) == {"lease_tasks": "feasible", "local_sequential": "selected"}
    assert report.selected is not None and report.selected.launcher == "local_process"


def test_gpu_tasks_need_gpus_and_enough_vram() -> None:
    none = _plan({"kind": "independent_tasks", "task_count": 3, "needs_gpu": True}, {})
    assert set(_status(none).values()) == {"infeasible"}
    assert "set resources.gpus >= 1" in (none.no_valid_strategy_hint or "")
    small = _plan({"kind": "independent_tasks", "task_count": 3, "needs_gpu": True, "vram_gb_per_task": 30},
                  {"gpus": 2, "gpu_type": "l4"})
    assert set(_status(small).values()) == {"infeasible"}


def test_multi_host_plans_are_not_colocated_and_a_same_host_link_is_flagged() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-1.5B", "method": "full",
                    "train_tokens_m": 50},
                   {"gpus": 8, "gpu_type": "a100-80gb", "hosts": 2}, {"mode": "fastest"})
    assert report.selected is not None and report.selected.workers == 8
    assert report.selected.colocated is False
    assert any(w.startswith("resources.hosts = 2 but interconnect = same_host_pcie") for w in report.warnings)
    fixed = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-1.5B", "method": "full",
                   "train_tokens_m": 50},
                  {"gpus": 8, "gpu_type": "a100-80gb", "hosts": 2, "interconnect": "multi_node_ib",
                   "hourly_cost_usd_per_gpu": 1.5},
                  {"mode": "cheapest"})
    assert fixed.warnings == [] and fixed.selected is not None
    assert fixed.selected.workers <= 4 and fixed.selected.colocated is True
