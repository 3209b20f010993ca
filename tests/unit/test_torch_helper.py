"""the in-script torch helper — device choice, env accessors, heartbeats,
metrics, the checkpoint gate, and (with torch) a single-process save/restore round trip."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime.torch as ft
from flashruntime.torch import _compute_time, _hang, _heartbeat, _state
from flashruntime.torch._checkpoint import checkpoint_due
from tests._support import REPO_ROOT

_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "FLASHML_OUTPUT_DIR", "FLASHML_CKPT_DIR",
        "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID")


@pytest.fixture(autouse=True)
def fresh_helper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A new per-process state and a clean environment, as a new process would have."""
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    monkeypatch.setattr(_compute_time, "CLOCK", _compute_time.ComputeClock())
    # The stack dump is armed once per process and registers a signal handler; arming it inside
    # pytest would leak into every later test, so these tests run as an already-armed process.
    # Arming itself is driven in real rank processes in tests/integration/test_stack_dumps.py.
    monkeypatch.setattr(_hang, "_ARMED", [True])
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "job" / "task-000"
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(out))
    return out


# --- _resolve_device ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "cuda", "local_rank", "count", "expected"),
    [
        (1, False, 0, 0, "cpu"),
        (4, False, 3, 0, "cpu"),  # without CUDA any local rank runs on the CPU
        (1, True, 0, 1, "cuda:0"),
        (2, True, 1, 2, "cuda:1"),
        (8, True, 3, 8, "cuda:3"),
    ],
)
def test_resolve_device_choices(world: int, cuda: bool, local_rank: int, count: int, expected: str) -> None:
    assert _state._resolve_device(world, cuda, local_rank, count) == expected


def test_resolve_device_refuses_two_ranks_on_one_gpu_with_the_exact_message() -> None:
    with pytest.raises(ValueError) as info:
        _state._resolve_device(2, True, 1, 1)
    assert str(info.value) == "LOCAL_RANK 1 but only 1 CUDA device is visible; use nproc_per_node <= 1, or gloo on CPU"


def test_resolve_device_message_counts_several_devices() -> None:
    with pytest.raises(ValueError, match=r"^LOCAL_RANK 3 but only 2 CUDA devices are visible; use nproc_per_node <= 2"):
        _state._resolve_device(4, True, 3, 2)
    with pytest.raises(ValueError, match="LOCAL_RANK -1 is negative"):
        _state._resolve_device(1, True, -1, 2)


# --- accessors and directories ---------------------------------------------------------


def test_accessor_defaults_without_torchrun() -> None:
    assert (ft.rank(), ft.world_size(), ft.is_main(), ft.start_step(), ft.device(), ft.backend()) == (
        0, 1, True, 0, "cpu", None)
    assert ft.__all__ == ["prepare", "checkpoint", "checkpoint_cadence", "log_metrics", "rank", "world_size",
                          "is_main", "start_step", "device", "backend", "wait_for_checkpoint"]


def test_accessors_read_the_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert (ft.world_size(), ft.rank(), ft.is_main()) == (4, 3, False)
    monkeypatch.setenv("RANK", "0")
    assert ft.is_main()
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='four' is not an integer"):
        ft.world_size()


def test_checkpoint_root_prefers_the_env_and_falls_back_to_the_job_tree(
    monkeypatch: pytest.MonkeyPatch, fresh_helper: Path, tmp_path: Path
) -> None:
    assert _state.checkpoint_root().resolve() == (tmp_path / "job" / "ckpt").resolve()
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "shared"))
    assert _state.checkpoint_root() == tmp_path / "shared"
    monkeypatch.delenv("FLASHML_OUTPUT_DIR")
    assert _state.output_dir() == Path(".")


# --- heartbeats ----------------------------------------------------------------------


def _beat_file(out: Path, rank: int = 0) -> dict:
    return json.loads((out / "ranks" / f"rank-{rank}.json").read_text())


def test_heartbeat_writes_the_documented_keys(monkeypatch: pytest.MonkeyPatch, fresh_helper: Path) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert _heartbeat.beat(7, force=True, now=100.0)
    record = _beat_file(fresh_helper, 2)
    assert set(record) == {"rank", "local_rank", "pid", "device", "backend", "world_size", "step", "ts", "host",
                           "compute_s"}
    assert (record["host"], record["compute_s"]) == (socket.gethostname(), [])
    assert (record["rank"], record["local_rank"], record["pid"], record["world_size"], record["step"]) == (
        2, 0, os.getpid(), 4, 7)
    assert (record["device"], record["backend"]) == ("cpu", None)
    assert [p.name for p in (fresh_helper / "ranks").iterdir()] == ["rank-2.json"]  # no temp file left behind


def test_heartbeat_is_throttled_to_one_write_per_second_unless_forced(fresh_helper: Path) -> None:
    assert _heartbeat.beat(1, now=10.0)  # first beat always writes
    assert not _heartbeat.beat(2, now=10.5)
    assert _beat_file(fresh_helper)["step"] == 1
    assert _heartbeat.beat(3, force=True, now=10.6)
    assert _beat_file(fresh_helper)["step"] == 3
    assert not _heartbeat.beat(4, now=11.5)
    assert _heartbeat.beat(5, now=11.6)
    assert _beat_file(fresh_helper)["step"] == 5
    assert _heartbeat.heartbeat_due(None, 0.0) and _heartbeat.heartbeat_due(5.0, 6.0)
    assert not _heartbeat.heartbeat_due(5.0, 5.99) and _heartbeat.heartbeat_due(5.0, 5.1, force=True)


def test_heartbeat_swallows_io_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(blocker))
    assert _heartbeat.beat(1, force=True) is False


# --- log_metrics ----------------------------------------------------------------------


def test_log_metrics_appends_json_lines_on_rank_zero(fresh_helper: Path) -> None:
    ft.log_metrics({"step": 1, "loss": 0.5})
    ft.log_metrics({"step": 2, "loss": 0.25, "note": object()})  # unserialisable values become strings
    lines = [json.loads(line) for line in (fresh_helper / "metrics.jsonl").read_text().splitlines()]
    assert [(d["step"], d["loss"]) for d in lines] == [(1, 0.5), (2, 0.25)]
    assert lines[1]["note"].startswith("<object object")
    assert _beat_file(fresh_helper)["step"] == 1  # the second call fell inside the throttle window
    assert 0 < lines[0]["ts"] <= lines[1]["ts"]  # when each step ended, for the goodput ledger
    ft.log_metrics({"step": 3, "ts": 12.5})
    assert json.loads((fresh_helper / "metrics.jsonl").read_text().splitlines()[-1])["ts"] == 12.5  # the caller's


def test_log_metrics_on_other_ranks_only_beats(monkeypatch: pytest.MonkeyPatch, fresh_helper: Path) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ft.log_metrics({"step": 4, "loss": 1.0})
    assert not (fresh_helper / "metrics.jsonl").exists()
    assert _beat_file(fresh_helper, 1)["step"] == 4


@pytest.mark.parametrize("bad", [None, [1, 2], {"step": True, "x": float("nan")}, {1: {2, 3}}])
def test_log_metrics_never_raises(bad: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ft.log_metrics(bad)  # type: ignore[arg-type]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(blocker))
    ft.log_metrics({"step": 1})  # unwritable output dir: silently dropped


# --- checkpoint gate --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "every", "due"),
    [(5, None, True), (0, None, True), (10, 5, True), (7, 5, False), (0, 5, False), (10, 0, False),
     (10, -2, False), (1, 1, True)],
)
def test_checkpoint_gate(step: int, every: int | None, due: bool) -> None:
    assert checkpoint_due(step, every) is due


def test_gated_checkpoint_writes_nothing_but_refreshes_the_heartbeat(
    monkeypatch: pytest.MonkeyPatch, fresh_helper: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "ckpt"))
    ft.checkpoint(object(), step=7, every=5)  # not due: the model is never touched
    assert not (tmp_path / "ckpt").exists()
    assert _beat_file(fresh_helper)["step"] == 7


# --- with torch: single-process save and restore -----------------------------------------


def _tiny(torch):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(4, 3)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.torch
def test_single_process_checkpoint_then_prepare_restores_it(
    monkeypatch: pytest.MonkeyPatch, fresh_helper: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from flashruntime.checkpoint.local import latest_valid_manifest, verify_manifest

    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(ckpt))
    monkeypatch.setenv("FLASHML_JOB_ID", "job-x")
    model, optimizer = _tiny(torch)
    leftover = ckpt / "step-000006"
    leftover.mkdir(parents=True)
    (leftover / "model.pt").write_bytes(b"half-written by a crashed attempt")
    (leftover / "junk.bin").write_bytes(b"x")

    ft.checkpoint(model, optimizer, step=3, every=3)
    ft.checkpoint(model, optimizer, step=6)  # every=None: unconditional; the unverified leftover is cleared
    assert sorted(p.name for p in leftover.iterdir()) == ["manifest.json", "model.pt", "optimizer.pt", "resume.pt"]
    manifest = latest_valid_manifest(ckpt)
    assert manifest is not None and manifest.step == 6 and verify_manifest(manifest, leftover)
    assert (manifest.job_id, manifest.attempt_id, manifest.world_size) == ("job-x", "local", 1)
    assert manifest.framework == "pytorch-" + torch.__version__.split("+")[0]
    assert "+" not in manifest.framework

    monkeypatch.setattr(_state, "STATE", _state.HelperState())  # as a relaunched process
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    loader = object()
    got_model, got_opt, got_loader = ft.prepare(fresh, fresh_opt, loader)
    assert got_model is fresh and got_opt is fresh_opt and got_loader is loader  # single CPU process: pass-through
    assert ft.start_step() == 6 and ft.device() == "cpu" and ft.backend() is None
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    momentum = [fresh_opt.state[p]["momentum_buffer"] for p in fresh.parameters()]
    assert all(torch.equal(a, optimizer.state[b]["momentum_buffer"]) for a, b in zip(momentum, model.parameters()))
    assert _beat_file(fresh_helper)["step"] == 6  # prepare's forced heartbeat

    (leftover / "model.pt").write_bytes(b"corrupted")  # the newest no longer verifies: fall back to step 3
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    ft.prepare(torch.nn.Linear(3, 2))
    assert ft.start_step() == 3


@pytest.mark.torch
def test_prepare_without_checkpoint_starts_at_zero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "missing"))
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    ft.prepare(model)
    assert ft.start_step() == 0 and torch.equal(model.weight, before)


_GROUP_SCRIPT = textwrap.dedent(
    """
    import atexit, json, os, sys
    import torch, torch.distributed as dist
    import flashruntime.torch as ft
    registered = []
    real_register = atexit.register
    def spy(fn, *a, **k):  # torch registers hooks of its own on import; keep only ours
        if getattr(fn, "__module__", "").startswith("flashruntime"):
            registered.append(fn.__name__)
        return real_register(fn, *a, **k)
    atexit.register = spy
    real_init = dist.init_process_group
    # A one-process gloo group stands in for torchrun's; WORLD_SIZE=2 sends prepare down the DDP path.
    dist.init_process_group = lambda backend, **kw: real_init(backend, rank=0, world_size=1)
    os.environ.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    data = torch.utils.data.TensorDataset(torch.arange(8.0).unsqueeze(1))
    loader = torch.utils.data.DataLoader(data, batch_size=2, drop_last=True)
    model, _, loader = ft.prepare(torch.nn.Linear(1, 1), None, loader)
    first = dict(registered=list(registered), backend=ft.backend(), wrapped=type(model).__name__,
                 sampler=type(loader.sampler).__name__, replicas=loader.sampler.num_replicas,
                 seed=loader.sampler.seed, batch=loader.batch_size, drop_last=loader.drop_last)
    ft.prepare(torch.nn.Linear(1, 1))  # group already up: nothing new registered
    dist.destroy_process_group()
    ft.prepare(torch.nn.Linear(1, 1))  # initialised again by prepare, but the hook is registered once
    first["after"] = list(registered)
    print(json.dumps(first))
    """
)


@pytest.mark.torch
def test_prepare_registers_the_exit_hook_once_and_only_when_it_initialised_the_group(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in _ENV}
    env.update(FLASHML_OUTPUT_DIR=str(tmp_path / "out"), FLASHML_CKPT_DIR=str(tmp_path / "ckpt"),
               PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", _GROUP_SCRIPT, str(port)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # the helper's first heartbeat adds the rank's word that it is exiting, for the hang watch: once too
    assert report["registered"] == ["_destroy_group_at_exit", "_say_exiting"]
    assert report["after"] == ["_destroy_group_at_exit", "_say_exiting"]
    assert (report["backend"], report["wrapped"]) == ("gloo", "DistributedDataParallel")
    assert (report["sampler"], report["replicas"], report["seed"]) == ("ElasticSampler", 2, 0)
    assert (report["batch"], report["drop_last"]) == (2, True)


@pytest.mark.torch
def test_prepare_restores_from_a_checkpoint_tree_that_moved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "written-here"))
    model, _ = _tiny(torch)
    ft.checkpoint(model, step=2)
    (tmp_path / "written-here").rename(tmp_path / "mounted-there")  # storage_prefix now points nowhere
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(tmp_path / "mounted-there"))
    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    fresh = torch.nn.Linear(3, 2)
    ft.prepare(fresh)
    assert ft.start_step() == 2 and torch.equal(fresh.weight, model.weight)
