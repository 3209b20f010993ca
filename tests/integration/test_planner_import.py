"""Importing the planner stays cheap: only pydantic and the standard library, no ML
framework, no yaml; and planning works with every optional dependency refused."""

from __future__ import annotations

import json

from tests._support import run_core_only

FORBIDDEN = ["torch", "numpy", "sklearn", "transformers", "fastapi", "uvicorn", "httpx", "psutil", "yaml"]


def test_planner_plans_with_only_the_core_and_loads_nothing_forbidden() -> None:
    result = run_core_only(
        "import json\n"
        "import flashruntime.planner as p\n"
        "from flashruntime.protocol.plan_v1alpha1 import PlanRequest\n"
        "r = p.plan(PlanRequest.model_validate({'workload': {'kind': 'transformer_finetune', 'model': 'gpt2'},"
        " 'resources': {'gpus': 1, 'gpu_type': 'l4'}}))\n"
        "p.render(r)\n"
        f"print(json.dumps([r.selected.strategy_family, sorted(m for m in {FORBIDDEN!r} if m in sys.modules)]))\n"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["single_gpu", []]
