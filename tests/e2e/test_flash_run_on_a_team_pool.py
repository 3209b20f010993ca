"""``flash.run`` of an ``independent_tasks`` plan carried out by the bundled worker through
placement gate 2's trusted-pool alternative: a real coordinator, the job POSTed by
``flash.run(..., pool=...)``, and one real ``flashruntime worker --runner trusted --pools``
process running every task, on a coordinator on SQLite and on PostgreSQL. Without a pool
the job's argv tasks are never claimed by the bundled worker, which is not ``argv_capable``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.protocol.plan_v1alpha1 import StrategyPlan
from flashruntime.protocol.v1alpha1 import IsolationSpec
from tests.service_server import run_worker, serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

# Writes its metrics where the worker collects them. No braces: every argv token is a template
# filled from the task's parameters.
TRIAL = ("import json, os, sys; out = os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'); "
         "json.dump(dict(lr=float(sys.argv[1])), open(out, 'w'))")


def _plan() -> StrategyPlan:
    return StrategyPlan(plan_id="pl_00aa11bb22cc33dd", planner_version="0.1.0", workload_mode="independent_tasks",
                        strategy_family="lease_tasks", launcher="flashruntime-leases", workers=2)


def _workload() -> flash.CommandWorkload:
    return flash.CommandWorkload(command=[sys.executable, "-c", TRIAL, "{lr}"], task_params=[{"lr": 0.1}, {"lr": 0.01}],
                                 isolation=IsolationSpec(tier="sandboxed", allowFallback=True))


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> dict[str, str]:
    """The coordinator's database: its default SQLite file, or a PostgreSQL one (the same
    flash.run and worker code, unchanged)."""
    if request.param == "sqlite":
        return {}
    return {"database_url": request.getfixturevalue("postgres_url")}


def test_a_plan_run_with_a_pool_is_carried_out_by_a_trusted_worker_of_that_pool(
        tmp_path: Path, database: dict[str, str]) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", **database)) as url, \
            httpx.Client(base_url=url, timeout=10) as api:
        record = flash.run(_plan(), url, workload=_workload(), image="local/trial:1", pool="team-7")
        assert record.spec.spec.placement.pool == "team-7"
        code, log = run_worker(url, tmp_path / "work", "--node-id", "w1", "--runner", "trusted", "--pools", "team-7",
                               max_tasks=2)
        assert code == 0, log
        deadline = time.monotonic() + 30
        while (job := api.get(f"/v1alpha1/jobs/{record.job_id}").json())["state"] == "RUNNING" \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job["state"] == "SUCCEEDED", (job, log)
        for task_id, lr in (("task-000", 0.1), ("task-001", 0.01)):
            got = api.get(f"/v1alpha1/artifacts/jobs/{record.job_id}/{task_id}/metrics.json")
            assert got.status_code == 200, got.text
            assert got.json() == {"lr": lr}


def test_without_a_pool_the_sandbox_waiver_is_refused_by_the_coordinator(tmp_path: Path) -> None:
    """What ``pool`` is for: the waiver alone, outside a team pool, is a 422 (the first admission rule)."""
    refused = pytest.raises(RuntimeError, match=r"-> 422: .*allowFallback is true but placement.pool is 'any'")
    with serve_in_thread(settings_for(tmp_path / "data")) as url, refused:
        flash.run(_plan(), url, workload=_workload(), image="local/trial:1")


@pytest.mark.parametrize("pool", ["", "  ", 7])
def test_a_pool_that_is_no_pool_id_is_refused_before_anything_is_sent(pool: object) -> None:
    with pytest.raises(ValueError, match=r"pool must be a team pool id such as 'team-7', or None for any worker"):
        flash.run(_plan(), "http://127.0.0.1:1", workload=_workload(), image="local/trial:1", pool=pool)  # type: ignore[arg-type]
