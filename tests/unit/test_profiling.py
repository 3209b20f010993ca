"""The profiling contract without a process: the cache (one suite, memory and SQLite), the
key, the summary of rank records, argument checks, and the Young/Daly advice."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flashruntime.errors import InvalidProfileRequest, ProfileError
from flashruntime.profiling import (
    InMemoryProfileCache,
    LocalProfiler,
    ProfileCache,
    ProfileResult,
    SqliteProfileCache,
    checkpoint_advice,
    expected_goodput,
    profile_key,
)
from flashruntime.profiling.local import summarise
from flashruntime.protocol.plan_v1alpha1 import PlanRequest

RESULT = ProfileResult(step_time_s=0.25, measured_steps=10, warmup_steps=3, peak_vram_gb=20.5,
                       checkpoint_save_s=12.0, strategy_family="ddp", workers=2)


@pytest.fixture(params=["memory", "sqlite"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> ProfileCache:
    return InMemoryProfileCache() if request.param == "memory" else SqliteProfileCache(tmp_path / "p.sqlite")


def test_a_cache_returns_what_was_put_and_none_for_other_keys(cache: ProfileCache) -> None:
    assert isinstance(cache, ProfileCache) and cache.get("k") is None
    cache.put("k", RESULT)
    assert cache.get("k") == RESULT and cache.get("other") is None
    cache.put("k", RESULT.model_copy(update={"step_time_s": 0.5}))
    assert cache.get("k").step_time_s == 0.5
    with pytest.raises(InvalidProfileRequest, match="non-empty string"):
        cache.put("", RESULT)


def test_the_sqlite_cache_outlives_its_object(tmp_path: Path) -> None:
    SqliteProfileCache(tmp_path / "p.sqlite").put("k", RESULT)
    assert SqliteProfileCache(tmp_path / "p.sqlite").get("k") == RESULT
    with pytest.raises(InvalidProfileRequest, match="is a directory; give a file path"):
        SqliteProfileCache(tmp_path)


def test_the_key_changes_with_what_determines_the_numbers() -> None:
    def req(**workload: object) -> PlanRequest:
        base = {"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-7B", "seq_len": 2048}
        return PlanRequest.model_validate({"workload": {**base, **workload},
                                           "resources": {"gpus": 2, "gpu_type": "A100-80GB"}})

    versions = {"flashruntime": "0.5.0", "torch": "2.13.0"}
    key = profile_key(req(), None, "python t.py", versions)
    assert key == profile_key(req(seq_len=1500), None, "python t.py", versions)  # same bucket
    assert key != profile_key(req(seq_len=4096), None, "python t.py", versions)
    assert key != profile_key(req(model="other"), None, "python t.py", versions)
    assert key != profile_key(req(), None, "python t.py", {**versions, "torch": "2.14.0"})
    assert key != profile_key(req(), None, "torchrun --nproc-per-node 2 t.py", versions)


def test_rank_records_summarise_to_the_slowest_median_and_the_largest_peak() -> None:
    def marks(step_s: float) -> list[list[float]]:
        return [[k, k * step_s + (5.0 if k > 0 else 0.0), 0.01 * k, None] for k in range(6)]

    records = [
        {"rank": 0, "world_size": 2, "device": "cpu", "warmup": 2, "measured": 3, "marks": marks(0.1),
         "host_ram_gb": 1.0, "peak_vram_gb": None, "checkpoint_save_s": 0.5, "checkpoint_restore_s": 0.2,
         "checkpoint_size_gb": 0.01},
        {"rank": 1, "world_size": 2, "device": "cpu", "warmup": 2, "measured": 3, "marks": marks(0.2),
         "host_ram_gb": 1.5, "peak_vram_gb": None},
    ]
    result = summarise(records, strategy_family="ddp", workers=2)
    assert math.isclose(result.step_time_s, 0.2) and result.host_ram_gb == 1.5  # warm-up's 5 s left out
    assert result.checkpoint_save_s == 0.5 and result.peak_vram_gb is None
    assert math.isclose(result.dataloader_wait_fraction, 0.03 / 0.3)
    with pytest.raises(ProfileError, match="no measured step"):
        summarise([{**records[0], "marks": marks(0.1)[:3]}])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"command": ""}, "command must be a non-empty string"),
    ({"command": "python t.py", "measured_steps": 0}, "measured_steps must be an integer >= 1, got 0"),
    ({"command": "python t.py", "warmup_steps": -1}, "warmup_steps must be an integer >= 0, got -1"),
])
def test_profiler_arguments_are_checked(kwargs: dict, message: str) -> None:
    command = kwargs.pop("command")
    with pytest.raises(InvalidProfileRequest, match=message):
        LocalProfiler(command, **kwargs)


@pytest.mark.parametrize("budget", [0, -1, math.inf, "300", True])
def test_a_budget_must_be_positive_seconds(budget: object) -> None:
    with pytest.raises(InvalidProfileRequest, match=r"budget_seconds must be a positive finite number"):
        LocalProfiler("python t.py").profile(None, None, budget_seconds=budget)  # type: ignore[arg-type]


def test_young_daly_interval_is_the_square_root_of_twice_cost_times_mtbf() -> None:
    advice = checkpoint_advice(12.0, 86_400.0)
    assert advice.interval_s == math.sqrt(2 * 12.0 * 86_400.0)
    assert advice.goodput == expected_goodput(advice.interval_s, 12.0, 86_400.0)
    assert "sqrt(2 x C 12 s x MTBF 86400 s)" in advice.line()
    with pytest.raises(InvalidProfileRequest, match="mtbf_s must be a finite number of seconds > 0, got 0"):
        checkpoint_advice(12.0, 0)


def test_the_advised_interval_beats_a_fixed_one_under_an_injected_failure_rate() -> None:
    # A 30 s checkpoint on a fleet failing every 2 h: the fixed 300 s default checkpoints
    # too often; Young/Daly advises 657 s, near the optimum of the goodput model.
    cost, mtbf = 30.0, 7_200.0
    advice = checkpoint_advice(cost, mtbf, source="injected failure rate")
    fixed = expected_goodput(300.0, cost, mtbf)
    assert advice.goodput > fixed
    for other in (150.0, 300.0, 600.0, 2_000.0, 4_000.0):
        assert advice.goodput >= expected_goodput(other, cost, mtbf) - 1e-3
    assert round(advice.goodput - fixed, 3) == 0.022  # 90.9 % against 88.6 %
