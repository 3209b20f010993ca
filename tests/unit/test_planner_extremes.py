"""Extreme but valid requests: the request models accept any positive
number, so the planner itself must turn figures no float can carry into a report — a hint
naming the input, or candidates rejected as out of range — never an exception, and never an
estimate JSON cannot hold (a report with inf serialises as null and no longer validates)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashruntime.planner import plan, render
from flashruntime.protocol.plan_v1alpha1 import PlanReport, PlanRequest

GPU_RES = {"gpus": 4, "gpu_type": "h100", "hourly_cost_usd_per_gpu": 1.0}
BASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "transformer_finetune": ({"kind": "transformer_finetune", "model": "gpt2", "train_tokens_m": 10}, GPU_RES),
    "transformer_finetune_full": (
        {"kind": "transformer_finetune", "model": "acme/unknown", "parameters_b": 1, "method": "full",
         "train_tokens_m": 10}, {**GPU_RES, "gpus": 3}),
    "pytorch_training": ({"kind": "pytorch_training", "parameters_m": 100, "est_train_gpu_hours": 10}, GPU_RES),
    "classical_ml": ({"kind": "classical_ml", "dataset_mb": 100, "supports_partial_fit": True}, {"hosts": 2}),
    "independent_tasks": (
        {"kind": "independent_tasks", "task_count": 10, "needs_gpu": True, "vram_gb_per_task": 1}, GPU_RES),
}
INT_FIELDS = {"seq_len", "micro_batch_per_gpu", "grad_accum", "hidden_size", "num_layers", "task_count"}
NUMERIC_FIELDS = {
    "transformer_finetune": ["parameters_b", "seq_len", "micro_batch_per_gpu", "grad_accum", "hidden_size",
                             "num_layers", "train_tokens_m"],
    "pytorch_training": ["parameters_m", "activation_gb_per_gpu", "est_train_gpu_hours"],
    "classical_ml": ["dataset_mb"],
    "independent_tasks": ["task_count", "est_minutes_per_task", "vram_gb_per_task"],
}
NUMERIC_FIELDS["transformer_finetune_full"] = NUMERIC_FIELDS["transformer_finetune"]
HUGE_FLOATS = [math.inf, 1.7e308, 1e300, 1.5e154]
HUGE_INTS = [10**400, 10**308, 10**300, 10**155]


def _request(base: str, **fields: Any) -> dict[str, Any]:
    workload, resources = BASES[base]
    request: dict[str, Any] = {"workload": dict(workload), "resources": dict(resources), "objective": {}}
    for dotted, value in fields.items():
        section, name = dotted.split("__")
        request[section][name] = value
    return request


def _check_report(report: PlanReport) -> None:
    """A report, selected or with a hint, whose figures are all finite, so that its JSON round-trips."""
    assert (report.selected is None) == (report.no_valid_strategy_hint is not None)
    for c in report.candidates:
        assert c.reasons
        figures = [c.scaling_efficiency, c.est_time_min and c.est_time_min.value,
                   c.est_cost_usd and c.est_cost_usd.value, c.memory and c.memory.total_gb]
        assert all(v is None or math.isfinite(v) for v in figures), (c.name, figures)
    assert PlanReport.model_validate_json(report.model_dump_json()) == report
    assert render(report).endswith(f"request {report.request_digest}\n")


def _plan(request: dict[str, Any]) -> PlanReport:
    report = plan(PlanRequest.model_validate(request))
    _check_report(report)
    return report


# --- inputs that once crashed the planner ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("request_", "hint"), [
    ({"workload": {"kind": "classical_ml", "dataset_mb": math.inf, "supports_partial_fit": True}},
     "workload.dataset_mb = inf is beyond what the planner can model: it is not a finite number"),
    ({"workload": {"kind": "independent_tasks", "task_count": 10**400}},
     ("workload.task_count = a 401-digit integer is beyond what the planner can model: it is too large for a "
      "64-bit float")),
    ({"workload": {"kind": "transformer_finetune", "model": "gpt2", "parameters_b": 1e300},
      "resources": {"gpus": 2, "gpu_type": "h100"}},
     ("workload.parameters_b = 1e+300 is beyond what the planner can model: scaled to units (x 1e+09) it "
      "overflows")),
    ({"workload": {"kind": "transformer_finetune", "model": "foo", "parameters_b": 1e300},
      "resources": {"gpus": 2, "gpu_type": "h100"}},
     "workload.parameters_b = 1e+300 is beyond what the planner can model"),
    ({"workload": {"kind": "transformer_finetune", "model": "gpt2", "seq_len": 10**400},
      "resources": {"gpus": 2, "gpu_type": "h100"}},
     "workload.seq_len = a 401-digit integer is beyond what the planner can model"),
    ({"workload": {"kind": "transformer_finetune", "model": "gpt2"}, "resources": {"gpus": 10**400, "gpu_type": "h100"}},
     "resources.gpus = a 401-digit integer is beyond what the planner can model"),
])
def test_figures_no_float_carries_give_a_hint_naming_the_input(request_: dict[str, Any], hint: str) -> None:
    report = _plan(request_)
    assert report.selected is None and report.candidates == []
    assert report.no_valid_strategy_hint is not None
    assert report.no_valid_strategy_hint.startswith(hint)
    assert report.no_valid_strategy_hint.endswith("; give a realistic figure")


def test_estimates_that_overflow_reject_the_candidates_naming_their_sources() -> None:
    # 1e300 x 1e6 tokens is a float, but 6 x N x tokens is not: time and cost overflow
    report = _plan({"workload": {"kind": "transformer_finetune", "model": "gpt2", "train_tokens_m": 1e300},
                    "resources": {"gpus": 2, "gpu_type": "h100", "hourly_cost_usd_per_gpu": 1}})
    assert report.selected is None
    assert {c.status for c in report.candidates} == {"infeasible"}
    for c in report.candidates:
        assert c.est_time_min is None and c.est_cost_usd is None
        assert any(r.startswith("estimate out of range: time inf min (from workload.parameters_b, train_tokens_m")
                   for r in c.reasons)
    assert report.no_valid_strategy_hint is not None
    assert report.no_valid_strategy_hint.endswith(
        "the request's figures are beyond what the planner can model; give realistic workload figures")


def test_an_infinite_price_rejects_rather_than_selects_an_infinite_cost() -> None:
    report = _plan(_request("pytorch_training", resources__hourly_cost_usd_per_gpu=math.inf))
    assert report.selected is None
    assert all("cost $inf (from the time x resources.hourly_cost_usd_per_gpu)" in " ".join(c.reasons)
               for c in report.candidates)


def test_unlimited_resources_and_limits_still_plan() -> None:
    # infinite capacities and limits mean "no limit" and stay accepted
    report = _plan(_request("transformer_finetune", resources__cpu_ram_gb=math.inf,
                            objective__deadline_minutes=math.inf, objective__max_cost_usd=math.inf))
    assert report.selected is not None


# --- every numeric field at extreme values -----------------------------------------------------------------------


def _id(value: Any) -> str:
    if isinstance(value, int) and value > 10**18:
        return f"10**{len(str(value)) - 1}"
    return str(value)


@pytest.mark.parametrize(("base", "field", "value"), [
    (base, field, value)
    for base, fields in NUMERIC_FIELDS.items()
    for field in fields
    for value in (HUGE_INTS if field in INT_FIELDS else HUGE_FLOATS)
] + [(base, "gpus", value) for base in ("transformer_finetune", "pytorch_training") for value in (10**400, 10**308)],
    ids=_id)
def test_each_numeric_field_at_an_extreme_value_gives_a_report(base: str, field: str, value: float) -> None:
    section = "resources" if field == "gpus" else "workload"
    _plan(_request(base, **{f"{section}__{field}": value}))


def _extreme(normal: st.SearchStrategy[Any], huge: list[Any]) -> st.SearchStrategy[Any]:
    return normal | st.sampled_from(huge)


FLOATS = HUGE_FLOATS + [1e200, 1e30]
INTS = HUGE_INTS + [10**200, 10**30]
finetune = st.fixed_dictionaries({
    "kind": st.just("transformer_finetune"),
    "model": st.sampled_from(["gpt2", "Qwen/Qwen2.5-7B", "acme/unknown"]),
    "parameters_b": _extreme(st.floats(0.01, 100), FLOATS),
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "seq_len": _extreme(st.integers(64, 8192), INTS),
    "micro_batch_per_gpu": _extreme(st.integers(1, 16), INTS),
    "grad_accum": _extreme(st.integers(1, 16), INTS),
    "activation_checkpointing": st.none() | st.booleans(),
    "hidden_size": st.none() | _extreme(st.integers(64, 8192), INTS),
    "num_layers": st.none() | _extreme(st.integers(1, 96), INTS),
    "train_tokens_m": st.none() | _extreme(st.floats(0.01, 1e4), FLOATS),
})
pytorch = st.fixed_dictionaries({
    "kind": st.just("pytorch_training"),
    "parameters_m": _extreme(st.floats(0.01, 1e4), FLOATS),
    "activation_gb_per_gpu": st.none() | _extreme(st.floats(0.01, 100), FLOATS),
    "est_train_gpu_hours": st.none() | _extreme(st.floats(0.01, 1e4), FLOATS),
})
classical = st.fixed_dictionaries({
    "kind": st.just("classical_ml"),
    "dataset_mb": _extreme(st.floats(0.01, 1e6), FLOATS),
    "supports_partial_fit": st.booleans(),
})
tasks = st.fixed_dictionaries({
    "kind": st.just("independent_tasks"),
    "task_count": _extreme(st.integers(1, 1000), INTS),
    "est_minutes_per_task": _extreme(st.floats(0.01, 1e3), FLOATS),
    "needs_gpu": st.booleans(),
    "vram_gb_per_task": _extreme(st.floats(0, 100), FLOATS),
})
resources = st.fixed_dictionaries({
    "gpus": _extreme(st.integers(0, 16), [10**400, 10**30]),
    "gpu_type": st.sampled_from(["h100", "rtx4090", "mystery-gpu"]),
    "vram_gb": st.none() | _extreme(st.floats(1, 200), [math.inf, 1e300]),
    "hosts": _extreme(st.integers(1, 4), [10**400]),
    "interconnect": st.sampled_from(["same_host_pcie", "multi_node_10g"]),
    "cpu_ram_gb": _extreme(st.floats(1, 1024), [math.inf, 1e300]),
    "cpu_cores": _extreme(st.integers(1, 64), [10**400]),
    "hourly_cost_usd_per_gpu": st.none() | _extreme(st.floats(0, 10), [math.inf, 1.7e308]),
})
objective = st.fixed_dictionaries({
    "mode": st.sampled_from(["cheapest", "fastest", "balanced", "reliable"]),
    "max_cost_usd": st.none() | _extreme(st.floats(0.01, 1e4), [math.inf, 1e300, 1e-300]),
    "deadline_minutes": st.none() | _extreme(st.floats(0.01, 1e5), [math.inf, 1e300, 1e-300]),
    "allow_quantization": st.booleans(),
})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(workload=st.one_of(finetune, pytorch, classical, tasks), resources=resources, objective=objective)
def test_any_valid_request_with_extreme_figures_gives_a_finite_report(
    workload: dict[str, Any], resources: dict[str, Any], objective: dict[str, Any]
) -> None:
    _plan({"workload": workload, "resources": resources, "objective": objective})
