"""planner_latency: ``flash.plan`` + ``render`` on the reference request (examples/plan-qwen7b-lora.yaml).

Each sample plans the same request and renders the report, timed with perf_counter_ns
in this process after one discarded warm-up call (which builds the deferred pydantic
schemas). Plan-only and render-only medians are informational rows.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import PLAN_RENDER_MS

NAME = "planner_latency"
SECTION = "performance"
MIN_SAMPLES = 200
SMOKE_SAMPLES = 20

# The reference request of the planner tests.
REQUEST: dict[str, Any] = {
    "workload": {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "method": "lora", "train_tokens_m": 25},
    "resources": {"gpus": 4, "gpu_type": "RTX4090", "hourly_cost_usd_per_gpu": 0.44},
    "objective": {"mode": "balanced", "max_cost_usd": 20, "deadline_minutes": 240},
}


def _ms(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e6


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    from flashruntime.planner import plan, render
    from flashruntime.protocol.plan_v1alpha1 import PlanRequest

    request = PlanRequest.model_validate(REQUEST)
    report = plan(request)
    render(report)  # warm-up: schema build and first-call caches, discarded
    samples = SMOKE_SAMPLES if smoke else max(repeats, MIN_SAMPLES)
    both: list[float] = []
    plan_only: list[float] = []
    render_only: list[float] = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        report = plan(request)
        t1 = time.perf_counter_ns()
        render(report)
        t2 = time.perf_counter_ns()
        both.append(_ms(t0, t2))
        plan_only.append(_ms(t0, t1))
        render_only.append(_ms(t1, t2))
    selected = report.selected
    chosen = "none" if selected is None else f"{selected.strategy_family} x{selected.workers}"
    notes = [f"the reference request; {len(report.candidates)} candidates; selected {chosen}", "GC enabled"]
    return [
        measured_row(NAME, SECTION, "plan_render_ms", "ms", both, target=PLAN_RENDER_MS,
                     notes=notes),
        measured_row(NAME, SECTION, "plan_ms", "ms", plan_only, notes=["informational: plan() alone"]),
        measured_row(NAME, SECTION, "render_ms", "ms", render_only, notes=["informational: render() alone"]),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="planning and rendering the reference request takes at most 1 ms (p50)",
    section=SECTION,
    run=run,
)
