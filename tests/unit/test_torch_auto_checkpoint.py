"""``ft.checkpoint(..., every="auto")``: the interval is Young/Daly's sqrt(2 x C x MTBF) for
the save cost the helper measured, in steps of the measured step time."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import pytest

import flashruntime.torch as ft
from flashruntime.errors import InvalidProfileRequest
from flashruntime.torch import _auto, _state


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    monkeypatch.setattr(_auto, "AUTO", _auto.AutoState())
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", _auto.MTBF_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(tmp_path / "job" / "task-000"))
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "ckpt"))
    return tmp_path / "ckpt"


def _saved(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*"))


@pytest.mark.torch
def test_the_auto_interval_is_young_daly_in_measured_steps(fresh: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert ft.checkpoint_cadence() is None
    in_force: dict[int, _auto.Cadence] = {}
    for step in range(1, 61):
        time.sleep(0.005)
        # A tiny MTBF keeps the interval a few steps of this tiny model (C of a few ms).
        ft.checkpoint(model, optimizer, step=step, every="auto", mtbf_s=0.2)
        if step in _saved(fresh):
            in_force.setdefault(step, ft.checkpoint_cadence())
    saves = _saved(fresh)
    assert saves[0] == 2 and len(saves) >= 2  # the first save measures C, at the second step seen
    for before, after in itertools.pairwise(saves):
        assert after - before == in_force[before].interval_steps  # the gap is the interval set at the save
    cadence = ft.checkpoint_cadence()
    assert cadence.checkpoint_s > 0 and cadence.step_time_s > 0 and cadence.mtbf_s == 0.2
    assert cadence.interval_s == math.sqrt(2 * cadence.checkpoint_s * cadence.mtbf_s)
    assert cadence.interval_steps == max(1, round(cadence.interval_s / cadence.step_time_s))


def test_the_failure_rate_comes_from_the_argument_the_environment_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_auto.MTBF_ENV, raising=False)
    assert _auto.mtbf(None) == _auto.DEFAULT_MTBF_S == 86_400
    monkeypatch.setenv(_auto.MTBF_ENV, "3600")
    assert _auto.mtbf(None) == 3600 and _auto.mtbf(60) == 60
    monkeypatch.setenv(_auto.MTBF_ENV, "daily")
    with pytest.raises(InvalidProfileRequest, match="FLASHML_CHECKPOINT_MTBF_S='daily' is not a number"):
        _auto.mtbf(None)
    with pytest.raises(InvalidProfileRequest, match="mtbf_s must be the mean seconds between failures"):
        _auto.mtbf(0)


def test_the_cadence_in_steps(fresh: Path) -> None:
    assert _auto.cadence(8.0, 2.0, 3600.0) == _auto.Cadence(8.0, 2.0, 3600.0, 240.0, 120)
    assert _auto.cadence(0.0, 0.5, 3600.0).interval_steps == 1  # a free save: every step


def test_every_takes_none_a_step_count_or_auto(fresh: Path) -> None:
    with pytest.raises(InvalidProfileRequest, match="every must be None, a number of steps or 'auto'"):
        ft.checkpoint(object(), step=3, every="often")
