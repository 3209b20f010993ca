"""A rank's compute time: from its release (the optimizer's step, the end of a boundary call)
to its last accumulated gradient; kept in a bounded window that the heartbeat carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashruntime.torch import _compute_time, _heartbeat, _state
from flashruntime.torch._compute_time import KEPT, ComputeClock, close_sample, release


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ComputeClock:
    clock = ComputeClock()
    monkeypatch.setattr(_compute_time, "CLOCK", clock)
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(tmp_path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return clock


def test_a_sample_runs_from_the_release_to_the_last_gradient() -> None:
    assert close_sample(10.0, 10.25) == pytest.approx(0.25)
    assert close_sample(10.0, 9.0) is None  # no gradient since the release: a second boundary in one step
    assert close_sample(10.0, 10.0) is None
    assert close_sample(None, 10.0) is None and close_sample(10.0, None) is None


def test_release_closes_the_step_and_starts_the_next(fresh_clock: ComputeClock) -> None:
    release(fresh_clock, 1.0)
    fresh_clock.last_grad = 1.4
    release(fresh_clock, 1.5)  # the optimizer's step
    release(fresh_clock, 1.6)  # log_metrics in the same step: nothing more to close
    fresh_clock.last_grad = 1.9
    release(fresh_clock, 2.0)
    assert list(fresh_clock.samples) == [pytest.approx(0.4), pytest.approx(0.3)]
    assert fresh_clock.released == 2.0


def test_the_window_keeps_the_newest_times(fresh_clock: ComputeClock) -> None:
    for step in range(KEPT + 5):
        release(fresh_clock, float(step))
        fresh_clock.last_grad = step + 0.5
    release(fresh_clock, float(KEPT + 5))
    assert len(fresh_clock.samples) == KEPT
    assert fresh_clock.samples[0] == pytest.approx(0.5) and len(_compute_time.recent()) == KEPT


def test_a_boundary_call_counts_as_no_compute(fresh_clock: ComputeClock) -> None:
    @_compute_time.boundary
    def slow_logging() -> str:
        fresh_clock.last_grad = None  # a boundary call computes no gradient
        return "logged"

    assert slow_logging() == "logged" and slow_logging.__name__ == "slow_logging"
    assert fresh_clock.released is not None and list(fresh_clock.samples) == []


def test_the_first_full_window_forces_one_heartbeat(fresh_clock: ComputeClock, tmp_path: Path) -> None:
    assert _heartbeat.beat(1, now=100.0)
    for step in range(_compute_time.FIRST_FULL):
        release(fresh_clock, float(step))
        fresh_clock.last_grad = step + 0.5
    release(fresh_clock, 50.0)
    assert _heartbeat.beat(2, now=100.1)  # inside the throttle, but the window just filled
    assert not _heartbeat.beat(3, now=100.2)  # once only
    record = json.loads((tmp_path / "ranks" / "rank-0.json").read_text())
    assert record["step"] == 2 and record["compute_s"] == [0.5] * _compute_time.FIRST_FULL


def test_attach_stamps_gradients_and_the_optimizer_step(fresh_clock: ComputeClock) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    frozen = torch.nn.Linear(1, 1)
    frozen.weight.requires_grad_(False)
    model.append(frozen)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _compute_time.attach(model, optimizer)
    _compute_time.attach(model, optimizer)  # a second prepare hooks nothing twice
    assert len(fresh_clock.hooked) == 6  # 5 trainable tensors and the optimizer
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        assert fresh_clock.last_grad is not None and fresh_clock.last_grad > fresh_clock.released
        optimizer.step()
        optimizer.zero_grad()
    assert len(fresh_clock.samples) == 3 and all(sample > 0 for sample in fresh_clock.samples)


def test_attach_never_raises_on_what_it_cannot_hook(fresh_clock: ComputeClock) -> None:
    class NotAModel:
        def parameters(self) -> list[object]:
            raise RuntimeError("no parameters here")

    _compute_time.attach(NotAModel())
    assert fresh_clock.released is not None
