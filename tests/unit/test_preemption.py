"""Preemption notices: the settings both sides read, who the driver tells, and the ranks'
side (a handler that only raises a flag, the save it forces at the next checkpoint call,
the record it leaves and the clean exit), in a single process."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import flashruntime.torch as ft
from flashruntime.monitor.preemption import is_torchrun, notice_targets
from flashruntime.recovery.preemption import DEFAULT_GRACE_S, PreemptSettings, preempt_settings
from flashruntime.torch import _preempt, _state

# --- settings ---------------------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({}, PreemptSettings((signal.SIGTERM,), DEFAULT_GRACE_S)),
    ({"FLASHML_PREEMPT_SIGNAL": "USR1"}, PreemptSettings((signal.SIGUSR1,), DEFAULT_GRACE_S)),
    ({"FLASHML_PREEMPT_SIGNAL": "SIGTERM, sigusr1,SIGTERM"}, PreemptSettings((signal.SIGTERM, signal.SIGUSR1),
                                                                             DEFAULT_GRACE_S)),
    ({"FLASHML_PREEMPT_SIGNAL": str(int(signal.SIGUSR2))}, PreemptSettings((signal.SIGUSR2,), DEFAULT_GRACE_S)),
    ({"FLASHML_PREEMPT_SIGNAL": "none", "FLASHML_PREEMPT_GRACE_S": "0"}, PreemptSettings((), 0.0)),
    ({"FLASHML_PREEMPT_GRACE_S": " 90.5 "}, PreemptSettings((signal.SIGTERM,), 90.5)),
])
def test_the_settings_name_the_notice_signals_and_the_grace(env: dict[str, str], expected: PreemptSettings) -> None:
    assert preempt_settings(env) == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"FLASHML_PREEMPT_SIGNAL": "SIGBOGUS"}, r"FLASHML_PREEMPT_SIGNAL: 'SIGBOGUS' is not a signal .* or 'none'"),
    ({"FLASHML_PREEMPT_SIGNAL": "999"}, r"'999' is not a signal of this platform"),
    ({"FLASHML_PREEMPT_SIGNAL": "KILL"}, r"SIGKILL cannot be caught, so it cannot be a notice"),
    ({"FLASHML_PREEMPT_GRACE_S": "-1"}, r"FLASHML_PREEMPT_GRACE_S='-1' is not a number of seconds >= 0"),
    ({"FLASHML_PREEMPT_GRACE_S": "soon"}, r"FLASHML_PREEMPT_GRACE_S='soon' is not a number"),
    ({"FLASHML_PREEMPT_GRACE_S": "inf"}, r"FLASHML_PREEMPT_GRACE_S='inf' is not a number"),
])
def test_settings_that_name_no_signal_or_no_grace_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        preempt_settings(env)


def test_submit_refuses_a_bad_setting_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flashruntime as flash
    from flashruntime.errors import InvalidSubmission

    monkeypatch.setenv("FLASHML_PREEMPT_SIGNAL", "SIGBOGUS")
    with pytest.raises(InvalidSubmission, match="FLASHML_PREEMPT_SIGNAL"):
        flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "out",
                     watch=False, quiet=True)
    assert not (tmp_path / "out").exists()


# --- who is told ------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "expected"), [
    (["torchrun", "--nproc-per-node=2", "train.py"], True),
    (["/usr/bin/python3", "/venv/bin/torchrun", "--standalone", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "train.py"], True),
    (["python", "train.py", "torchrun"], False),
    (["python", "-m", "mypackage.train"], False),
    ([], False),
])
def test_a_torchrun_leader_is_recognised_however_it_was_started(argv: list[str], expected: bool) -> None:
    assert is_torchrun(argv) is expected


def test_torchruns_workers_are_told_and_never_torchrun_or_their_own_children() -> None:
    parents = {11: 10, 12: 10, 13: 11, 14: 1}  # 13: rank 0's data loader worker
    targets = notice_targets(10, {10, 11, 12, 13, 14}, cmdline=lambda pid: ["torchrun", "train.py"],
                             parent=parents.get)
    assert targets == [11, 12]


def test_a_torchrun_still_without_workers_is_told_itself() -> None:
    assert notice_targets(10, {10}, cmdline=lambda pid: ["torchrun", "train.py"], parent=lambda pid: None) == [10]


def test_a_plain_command_is_told_itself() -> None:
    assert notice_targets(10, {10, 11}, cmdline=lambda pid: ["python", "train.py"], parent=lambda pid: 10) == [10]


# The sandbox's launcher (bwrap, which forwards no signal), its init in the task's pid
# namespace, then the command: torchrun with two workers, or a plain script.
_SANDBOXED = {10: ["/usr/bin/bwrap", "--unshare-pid", "--", "torchrun", "train.py"], 11: ["bwrap", "--", "torchrun"],
              12: ["torchrun", "train.py"], 13: ["python", "train.py"], 14: ["python", "train.py"]}
_SANDBOXED_PARENTS = {11: 10, 12: 11, 13: 12, 14: 12}


def test_a_sandboxed_torchrun_s_workers_are_told_through_the_sandbox_s_launcher() -> None:
    targets = notice_targets(10, set(_SANDBOXED), cmdline=lambda pid: _SANDBOXED[pid], parent=_SANDBOXED_PARENTS.get)
    assert targets == [13, 14]


def test_a_sandboxed_plain_command_is_told_itself_and_never_the_launcher() -> None:
    argv = {10: ["bwrap", "--", "python", "train.py"], 11: ["bwrap"], 12: ["python", "train.py"], 13: ["python"]}
    parents = {11: 10, 12: 11, 13: 12}  # 13: a child of the script
    assert notice_targets(10, set(argv), cmdline=lambda pid: argv[pid], parent=parents.get) == [12]


def test_a_launcher_whose_command_has_not_started_is_told_itself() -> None:
    assert notice_targets(10, {10}, cmdline=lambda pid: ["bwrap", "--", "python"], parent=lambda pid: None) == [10]


# --- the ranks' side --------------------------------------------------------------


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A fresh process's helper state, launched by flashruntime, SIGUSR1 the notice."""
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    monkeypatch.setattr(_preempt, "NOTICE", _preempt.NoticeState())
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "FLASHML_PREEMPT_GRACE_S"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "job" / "task-000"
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(out))
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "job" / "ckpt"))
    monkeypatch.setenv("FLASHML_ATTEMPT_ID", "task-000")
    monkeypatch.setenv("FLASHML_PREEMPT_SIGNAL", "SIGUSR1")
    before = signal.getsignal(signal.SIGUSR1)
    yield out
    signal.signal(signal.SIGUSR1, before)


def test_a_notice_raises_the_flag_and_nothing_else(rank_env: Path) -> None:
    assert _preempt.arm() is True and _preempt.agreed() is False
    os.kill(os.getpid(), signal.SIGUSR1)
    assert _preempt.agreed() is True
    assert _preempt.NOTICE.received == signal.SIGUSR1


def test_outside_flashruntime_nothing_is_armed(rank_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_ATTEMPT_ID")
    assert _preempt.arm() is False
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_handler_of_the_scripts_own_is_left_in_place(rank_env: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGUSR1, mine)
    assert _preempt.arm() is True
    assert signal.getsignal(signal.SIGUSR1) is mine


def test_after_a_notice_checkpoint_saves_this_step_whatever_the_gate_then_exits_0(rank_env: Path) -> None:
    torch = pytest.importorskip("torch")
    from flashruntime.checkpoint.local import latest_valid_manifest

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ft.prepare(model, optimizer)
    ft.checkpoint(model, optimizer, step=7, every=50)  # no notice: not due, no save
    assert latest_valid_manifest(rank_env.parent / "ckpt") is None
    os.kill(os.getpid(), signal.SIGUSR1)
    with pytest.raises(SystemExit) as leaving:
        ft.checkpoint(model, optimizer, step=8, every=50)
    assert leaving.value.code == 0
    manifest = latest_valid_manifest(rank_env.parent / "ckpt")
    assert manifest is not None and manifest.step == 8
    record = json.loads((rank_env / "ranks" / "rank-0.preempted.json").read_text())
    assert (record["rank"], record["world_size"], record["step"], record["signal"]) == (0, 1, 8, "SIGUSR1")
