"""``checkpoint(..., async_save=True)`` in one process: the host copy is a real copy taken at
the call, the write happens on a background thread one save at a time, a failed background
save is raised at the next call with the previous checkpoint still valid, and the host
stager reuses its memory."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import pytest

import flashruntime.torch as ft
from flashruntime.checkpoint.local import latest_valid_manifest, verify_manifest
from flashruntime.errors import CheckpointError, InvalidProfileRequest
from flashruntime.torch import _async_save, _state, _step

pytestmark = pytest.mark.torch

_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "FLASHML_OUTPUT_DIR", "FLASHML_CKPT_DIR",
        "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID")


class GatedWriter:
    """The real writer, held before each step until the test opens that step's gate; it
    logs when each write starts and ends."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = collections.defaultdict(threading.Event)
        self.log: list[str] = []

    def __call__(self, destination: _step.Destination, parts: dict[str, Any]) -> None:
        self.log.append(f"start {destination.step}")
        assert self.gates[destination.step].wait(60), "the test never opened the gate"  # hang guard
        _step.write_parts(destination, parts)
        self.log.append(f"end {destination.step}")


@pytest.fixture(autouse=True)
def fresh_helper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A new per-process state, saver and environment, as a new process would have."""
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    monkeypatch.setattr(_async_save, "SAVER", _async_save.BackgroundSaver())
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(tmp_path / "out"))
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(ckpt))
    return ckpt


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> GatedWriter:
    writer = GatedWriter()
    monkeypatch.setattr(_async_save, "SAVER", _async_save.BackgroundSaver(write=writer))
    return writer


def _model() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 16)).square().mean().backward()
    optimizer.step()
    return model, optimizer


class _WithExtra:
    """An optimizer whose state dict carries one more value (what a user's own state might hold)."""

    def __init__(self, optimizer: Any, extra: Any) -> None:
        self.optimizer, self.extra = optimizer, extra

    def state_dict(self) -> dict[str, Any]:
        return {**self.optimizer.state_dict(), "extra": self.extra}


def test_the_host_copy_is_the_state_at_the_call(fresh_helper: Path, gated: GatedWriter) -> None:
    import torch

    model, optimizer = _model()
    weight = model.weight.detach().clone()
    momentum = optimizer.state[model.weight]["momentum_buffer"].clone()
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    assert ft.wait_for_checkpoint(timeout=0) is False  # held at the gate: nothing committed yet
    assert latest_valid_manifest(fresh_helper) is None
    with torch.no_grad():  # training goes on while the step is written
        model.weight.add_(1.0)
        optimizer.state[model.weight]["momentum_buffer"].mul_(3.0)
    gated.gates[1].set()
    assert ft.wait_for_checkpoint() is True
    manifest = latest_valid_manifest(fresh_helper)
    assert manifest is not None and manifest.step == 1
    step_dir = fresh_helper / "step-000001"
    assert verify_manifest(manifest, step_dir)
    assert sorted(part.key for part in manifest.parts) == ["model.pt", "optimizer.pt", "resume.pt"]
    saved = torch.load(step_dir / "model.pt")
    assert torch.equal(saved["weight"], weight) and not torch.equal(saved["weight"], model.weight)
    saved_optimizer = torch.load(step_dir / "optimizer.pt")
    assert torch.equal(saved_optimizer["state"][0]["momentum_buffer"], momentum)
    resume = torch.load(step_dir / "resume.pt", weights_only=True)
    assert [entry["rank"] for entry in resume["ranks"]] == [0]


def test_a_save_waits_for_the_one_in_flight(fresh_helper: Path, gated: GatedWriter) -> None:
    model, optimizer = _model()
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    returned = threading.Event()

    def second() -> None:
        ft.checkpoint(model, optimizer, step=2, async_save=True)
        returned.set()

    caller = threading.Thread(target=second)
    caller.start()
    # Step 1 cannot finish before its gate opens, so the second call cannot have returned.
    assert not returned.wait(0.5)
    assert gated.log == ["start 1"]
    gated.gates[1].set()
    gated.gates[2].set()
    caller.join(60)
    assert returned.is_set()
    assert ft.wait_for_checkpoint()
    assert gated.log == ["start 1", "end 1", "start 2", "end 2"]
    assert latest_valid_manifest(fresh_helper).step == 2  # type: ignore[union-attr]


def test_a_synchronous_save_also_waits_for_the_one_in_flight(fresh_helper: Path, gated: GatedWriter) -> None:
    model, optimizer = _model()
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    gated.gates[1].set()
    ft.checkpoint(model, optimizer, step=2)  # returns with both committed, in order
    assert gated.log == ["start 1", "end 1"]
    assert latest_valid_manifest(fresh_helper, pattern="step-000001") is not None
    assert latest_valid_manifest(fresh_helper).step == 2  # type: ignore[union-attr]


def test_a_failed_background_save_is_raised_at_the_next_call(fresh_helper: Path) -> None:
    model, optimizer = _model()
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    assert ft.wait_for_checkpoint()
    # A lambda cannot be pickled: the background torch.save of step 2 fails.
    ft.checkpoint(model, _WithExtra(optimizer, lambda: 0), step=2, async_save=True)
    message = r"^the background save of checkpoint step 2 to .*step-000002' failed: .*the checkpoint before it"
    with pytest.raises(CheckpointError, match=message) as raised:
        ft.checkpoint(model, optimizer, step=3, async_save=True)  # waits for step 2 first
    assert isinstance(raised.value.__cause__, Exception)
    assert latest_valid_manifest(fresh_helper).step == 1  # type: ignore[union-attr]
    assert not (fresh_helper / "step-000002").exists()  # the uncommitted parts are given back
    ft.checkpoint(model, optimizer, step=3, async_save=True)  # reported once; saving goes on
    assert ft.wait_for_checkpoint()
    assert latest_valid_manifest(fresh_helper).step == 3  # type: ignore[union-attr]


def test_a_failure_is_raised_by_any_call_after_it_even_one_that_does_not_save(fresh_helper: Path) -> None:
    model, optimizer = _model()
    ft.checkpoint(model, _WithExtra(optimizer, lambda: 0), step=2, async_save=True)
    assert _async_save.SAVER.wait()  # the write has ended (in failure); nothing is raised by waiting alone
    with pytest.raises(CheckpointError, match="background save of checkpoint step 2"):
        ft.checkpoint(model, optimizer, step=3, every=5, async_save=True)  # not due
    ft.checkpoint(model, optimizer, step=4, every=5, async_save=True)  # reported once


def test_wait_for_checkpoint_raises_a_failed_save(fresh_helper: Path) -> None:
    model, optimizer = _model()
    ft.checkpoint(model, _WithExtra(optimizer, lambda: 0), step=4, async_save=True)
    with pytest.raises(CheckpointError, match="background save of checkpoint step 4"):
        ft.wait_for_checkpoint()
    assert ft.wait_for_checkpoint() is True  # nothing in flight, nothing more to report
    assert latest_valid_manifest(fresh_helper) is None


def test_other_ranks_write_nothing_and_never_wait(fresh_helper: Path, monkeypatch: pytest.MonkeyPatch,
                                                  gated: GatedWriter) -> None:
    monkeypatch.setenv("RANK", "1")  # WORLD_SIZE unset: no process group, so no collectives
    model, optimizer = _model()
    ft.checkpoint(model, optimizer, step=1, async_save=True)
    assert ft.wait_for_checkpoint(timeout=0) is True
    assert gated.log == [] and not fresh_helper.exists()


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_async_save_must_be_a_bool(bad: object) -> None:
    with pytest.raises(InvalidProfileRequest, match="async_save must be True or False"):
        ft.checkpoint(object(), step=1, async_save=bad)  # type: ignore[arg-type]


# --- HostStager -------------------------------------------------------------------------


def test_the_stager_copies_and_reuses_its_memory() -> None:
    import numpy
    import torch

    stager = _async_save.HostStager()
    weight = torch.arange(12.0).reshape(3, 4)
    state = collections.OrderedDict(weight=weight, tied=weight.detach(), step=7, name="w", none=None,
                                     pair=(torch.ones(2), 3), table=numpy.arange(3))
    state._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    first, events = stager.stage({"model.pt": state})
    assert events == []  # nothing came from a device
    copied = first["model.pt"]
    assert type(copied) is collections.OrderedDict and copied._metadata == {"": {"version": 2}}
    assert copied["weight"] is copied["tied"]  # the same view is copied once, as torch.save stores it once
    assert copied["weight"].data_ptr() != weight.data_ptr() and torch.equal(copied["weight"], weight)
    assert (copied["step"], copied["name"], copied["none"]) == (7, "w", None)
    assert isinstance(copied["pair"], tuple) and copied["pair"][1] == 3
    weight.add_(100.0)
    state["table"][0] = 50
    assert copied["weight"][0, 0].item() == 0.0 and copied["table"][0] == 0  # real copies
    assert stager.held_bytes == (12 + 2) * 4

    again, _ = stager.stage({"model.pt": state})
    assert again["model.pt"]["weight"].data_ptr() == copied["weight"].data_ptr()  # the same host memory
    assert again["model.pt"]["weight"][0, 0].item() == 100.0
    state["weight"] = torch.zeros(5)
    reshaped, _ = stager.stage({"model.pt": state})
    assert reshaped["model.pt"]["weight"].shape == (5,)  # a new shape gets new memory
    assert stager.held_bytes == (5 + 12 + 2) * 4


def test_at_exit_the_save_in_flight_is_finished_and_a_failure_printed(
        fresh_helper: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    gate = threading.Event()
    written: list[int] = []

    def write(destination: _step.Destination, parts: dict[str, Any]) -> None:
        assert gate.wait(60)  # hang guard
        written.append(destination.step)
        if destination.step == 3:
            raise OSError(28, "No space left on device")

    saver = _async_save.BackgroundSaver(write=write)
    saver.submit(_step.Destination.of(2), {"model.pt": {"w": torch.ones(2)}})
    assert saver.pending_step == 2
    gate.set()
    saver.finish_at_exit()
    assert written == [2] and saver.pending_step is None
    saver.submit(_step.Destination.of(3), {"model.pt": {"w": torch.ones(2)}})
    saver.finish_at_exit()
    assert written == [2, 3]
    err = capsys.readouterr().err
    assert "flashruntime: the background save of checkpoint step 3 to " in err
    assert "No space left on device" in err
