"""The coordinator scenarios (``coordinator_claims``, ``lease_mttd_mttr``) run at smoke
scale against a real ``flashruntime serve`` and write honest rows. Tests never assert on
speed (DESIGN.md): only on shape, honesty, the stated bound and the recovery count."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.rows import judge
from benchmarks.scenarios import _coordinator_http, coordinator_claims, lease_mttd_mttr

pytestmark = [pytest.mark.bench_smoke, pytest.mark.service]
pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

WORK = _coordinator_http.WORK_DIR
MTTD_SLACK_S = 3.0  # a loaded 2-core host may run a sweep late; the bound itself is in the notes


def _by_metric(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["metric"]: row for row in rows}


def _scratch(name: str) -> set[Any]:
    return set(WORK.glob(f"{name}-*")) if WORK.exists() else set()


def _serve_processes() -> set[int]:
    """Pids of ``flashruntime serve`` processes run from this checkout's benchmark work dir."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
    return {int(line.split(None, 1)[0]) for line in listing.splitlines()
            if " serve " in line and str(WORK) in line}


def _common_checks(rows: list[dict[str, Any]], name: str, section: str, targeted: frozenset[str] = frozenset()) -> None:
    assert {row["scenario"] for row in rows} == {name}
    for row in rows:
        assert row["section"] == section
        assert row["status"] == "measured", row.get("skip_reason")
        assert row["skip_reason"] is None and row["unit"] and row["notes"]
        assert row["repeats"] >= 1 and row["min"] <= row["median"] <= row["max"]
        judged = judge(dict(row), on_reference_host=True)
        if row["metric"] in targeted:
            assert row["target"] is not None and judged["met"] in (True, False)
        else:
            assert row["target"] is None and judged["met"] is None  # no target, nothing to judge


def test_both_scenarios_are_registered() -> None:
    assert SCENARIOS["coordinator_claims"] is coordinator_claims.SCENARIO
    assert SCENARIOS["lease_mttd_mttr"] is lease_mttd_mttr.SCENARIO
    assert coordinator_claims.SCENARIO.section == "performance"
    assert lease_mttd_mttr.SCENARIO.section == "resilience"


def test_coordinator_claims_smoke_rows() -> None:
    before, serving = _scratch("coordinator_claims"), _serve_processes()
    rows = coordinator_claims.SCENARIO.run(1, True)
    by_metric = _by_metric(rows)
    assert set(by_metric) == {metric for metric, _ in coordinator_claims.METRICS}
    targeted = frozenset({"sqlite_4_clients_cycles_per_s", "postgres_2_replicas_4_clients_cycles_per_s"})
    _common_checks(rows, "coordinator_claims", "performance", targeted)

    for clients in ("1_client", "4_clients"):
        sqlite = by_metric[f"sqlite_{clients}_cycles_per_s"]
        assert sqlite["unit"] == "cycles/s" and sqlite["repeats"] == 1 and sqlite["median"] > 0
        assert "LeaseManager" in sqlite["comparator"]["name"] and sqlite["comparator"]["median"] > 0
        assert sqlite["ratio"] == pytest.approx(sqlite["median"] / sqlite["comparator"]["median"])
        one = by_metric[f"postgres_1_replica_{clients}_cycles_per_s"]
        two = by_metric[f"postgres_2_replicas_{clients}_cycles_per_s"]
        assert "LeaseManager" in one["comparator"]["name"] and one["median"] > 0
        assert two["comparator"]["name"].startswith("one replica on PostgreSQL")
        assert two["ratio"] == pytest.approx(two["median"] / one["median"])
    notes = " ".join(by_metric["sqlite_4_clients_cycles_per_s"]["notes"])
    assert f"N={coordinator_claims.SMOKE_TASKS}" in notes and "4 client(s) on one coordinator on SQLite" in notes
    assert "metrics.json" in notes and "ratio = HTTP cycles/s ÷ in-process cycles/s" in notes

    p50 = by_metric["sqlite_4_clients_per_cycle_p50_ms"]
    assert p50["unit"] == "ms" and p50["median"] > 0 and p50["comparator"]["median"] > 0
    assert p50["ratio"] == pytest.approx(p50["median"] / p50["comparator"]["median"])

    assert _scratch("coordinator_claims") == before, "the scenario left its scratch files behind"
    assert _serve_processes() <= serving, "the scenario left a coordinator running"


def test_lease_mttd_mttr_smoke_rows() -> None:
    before, serving = _scratch("lease_mttd_mttr"), _serve_processes()
    rows = lease_mttd_mttr.SCENARIO.run(1, True)
    by_metric = _by_metric(rows)
    assert set(by_metric) == {"mttd_s", "mttr_s", "sweep_lag_after_deadline_s", "leases_recovered",
                              "claim_rtt_ms", "heartbeat_rtt_ms"}
    _common_checks(rows, "lease_mttd_mttr", "resilience")
    assert all(row["comparator"] is None and row["ratio"] is None for row in rows)  # no comparator

    recovered = by_metric["leases_recovered"]
    assert recovered["repeats"] == 1 and recovered["min"] == 1.0  # every expired lease re-claimed and committed
    assert any("1 of 1 expired leases re-claimed" in note for note in recovered["notes"])

    mttd = by_metric["mttd_s"]
    bound = lease_mttd_mttr.LEASE_SECONDS + lease_mttd_mttr.SWEEP_INTERVAL_S
    assert mttd["unit"] == "s" and mttd["repeats"] == 1
    assert 0 < mttd["max"] <= bound + MTTD_SLACK_S
    assert any(f"bound lease_seconds + sweep_interval_s = {bound:g} s" in note for note in mttd["notes"])
    assert any("SIGKILL" in note and "sweep interval" in note for note in mttd["notes"])

    mttr = by_metric["mttr_s"]
    assert mttr["unit"] == "s" and mttr["median"] > 0
    lag = by_metric["sweep_lag_after_deadline_s"]
    assert lag["median"] >= 0  # the sweep never expires a lease before its deadline

    claims, beats = by_metric["claim_rtt_ms"], by_metric["heartbeat_rtt_ms"]
    assert claims["unit"] == beats["unit"] == "ms"
    assert claims["repeats"] == 2  # the worker's claim and the rescuer's
    assert beats["repeats"] == lease_mttd_mttr.HEARTBEATS_BEFORE_KILL
    assert any("p95 = " in note for note in claims["notes"]) and any("p95 = " in note for note in beats["notes"])

    assert _scratch("lease_mttd_mttr") == before, "the scenario left its scratch files behind"
    assert _serve_processes() <= serving, "the scenario left a coordinator running"


def test_without_the_service_extra_rows_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "the service extra is not installed (missing httpx): pip install 'flashruntime[service]'"
    monkeypatch.setattr(_coordinator_http, "service_missing", lambda: reason)
    for scenario in (coordinator_claims, lease_mttd_mttr):
        rows = scenario.SCENARIO.run(1, True)
        assert rows and all(row["status"] == "skipped" and row["skip_reason"] == reason for row in rows)
        assert all(row["median"] is None and row["repeats"] == 0 for row in rows)
