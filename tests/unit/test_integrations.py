"""integration builders produce exact argv and workloads, import no framework,
and the Hugging Face callback commits manifests (tested against a fake ``transformers``)."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from flashruntime import integrations
from flashruntime.integrations import huggingface, pytorch
from flashruntime.integrations import sklearn as sk
from flashruntime.workloads.command import CommandWorkload
from tests._support import run_core_only

# --- package ----------------------------------------------------------------------------


def test_submodules_load_lazily_without_any_framework() -> None:
    result = run_core_only(
        "import sys, flashruntime.integrations as I\n"
        "before = sorted(m for m in ('flashruntime.integrations.sklearn', 'flashruntime.integrations.pytorch') "
        "if m in sys.modules)\n"
        "I.sklearn.sweep, I.pytorch.ddp, I.huggingface.trainer, I.huggingface.latest_checkpoint\n"
        "I.huggingface.flashruntime_callback\n"
        "print(before, {'huggingface', 'pytorch', 'sklearn'} <= set(dir(I)))\n",
        refuse=("torch", "sklearn", "transformers", "numpy"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] True"
    assert integrations.__all__ == ["huggingface", "pytorch", "sklearn"]
    with pytest.raises(AttributeError, match="flashruntime.integrations' has no attribute 'keras'"):
        integrations.keras  # noqa: B018


# --- pytorch.ddp ------------------------------------------------------------------------


def test_single_node_ddp_argv_and_workload() -> None:
    w = pytorch.ddp("train.py", source="~/proj", script_args="--steps 40 --name 'a b'", env={"SEED": "1"})
    assert isinstance(w, CommandWorkload)
    assert w.argv() == ["torchrun", "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
                        "train.py", "--steps", "40", "--name", "a b"]
    assert (w.mode, w.resolved_mode(), w.source.path, w.env) == ("coordinated", "coordinated", "~/proj", {"SEED": "1"})
    assert w.outputs.collect == ["metrics.json"]
    assert w.checkpoint is not None and w.checkpoint.backend == "local_manifest" and w.checkpoint.note


def test_env_is_copied_not_shared() -> None:
    env = {"A": "1"}
    w = pytorch.ddp("t.py", env=env)
    env["A"] = "2"
    assert w.env == {"A": "1"}


def test_multi_node_ddp_argv() -> None:
    w = pytorch.ddp("train.py", nproc_per_node=4, nnodes=2, rdzv_endpoint="10.0.0.1:29400", node_rank=1,
                    rdzv_id="exp7", script_args="--steps 3")
    assert w.argv() == ["torchrun", "--nproc-per-node=4", "--nnodes=2", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=exp7", "--node-rank=1", "train.py",
                        "--steps", "3"]
    auto = pytorch.ddp("train.py", nnodes=3, rdzv_endpoint="127.0.0.1:29500")
    assert auto.argv() == ["torchrun", "--nproc-per-node=2", "--nnodes=3", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=127.0.0.1:29500", "--rdzv-id=flashruntime", "train.py"]


@pytest.mark.parametrize("node_rank", [-1, 2, 5])
def test_node_rank_must_lie_within_nnodes(node_rank: int) -> None:
    with pytest.raises(ValueError, match=rf"node_rank={node_rank} must satisfy 0 <= node_rank < nnodes=2"):
        pytorch.ddp("t.py", nnodes=2, rdzv_endpoint="h:1", node_rank=node_rank)


def test_node_rank_bounds_accepted_at_the_edges() -> None:
    assert "--node-rank=0" in pytorch.ddp("t.py", nnodes=2, rdzv_endpoint="h:1", node_rank=0).argv()
    assert "--node-rank=1" in pytorch.ddp("t.py", nnodes=2, rdzv_endpoint="h:1", node_rank=1).argv()


@pytest.mark.parametrize("nnodes", [0, -3])
def test_nnodes_below_one_is_refused(nnodes: int) -> None:
    with pytest.raises(ValueError, match=rf"nnodes={nnodes} must be >= 1"):
        pytorch.ddp("t.py", nnodes=nnodes)


@pytest.mark.parametrize("endpoint", [None, ""])
def test_multi_node_needs_a_rendezvous_endpoint(endpoint: str | None) -> None:
    with pytest.raises(ValueError, match=r"nnodes=2 needs rdzv_endpoint='host:port'"):
        pytorch.ddp("t.py", nnodes=2, rdzv_endpoint=endpoint)


@pytest.mark.parametrize("endpoint", ["10.0.0.1", ":29400", "host:port"])
def test_rendezvous_endpoint_must_be_host_port(endpoint: str) -> None:
    with pytest.raises(ValueError, match="is not 'host:port'"):
        pytorch.ddp("t.py", nnodes=2, rdzv_endpoint=endpoint)


def test_nproc_per_node_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="nproc_per_node=0 must be >= 1"):
        pytorch.ddp("t.py", nproc_per_node=0)


def test_an_elastic_ddp_starts_at_its_most_ranks_and_carries_the_range() -> None:
    from flashruntime.workloads.command import to_jobspec

    w = pytorch.ddp("train.py", nproc_per_node=(1, 4))
    assert w.argv()[:2] == ["torchrun", "--nproc-per-node=4"]
    assert w.ranks == (1, 4)
    assert pytorch.ddp("train.py").ranks is None
    with pytest.raises(ValueError, match="makes an elastic local run; a coordinator task runs at the size"):
        to_jobspec(w, "elastic")


@pytest.mark.parametrize(("nproc", "nnodes", "words"), [
    ((2, 1), 1, "must be (min, max) with 1 <= min <= max"), ((0, 2), 1, "must be (min, max)"),
    ((1, 2), 2, "(elastic) is for one machine, and nnodes=2"),
])
def test_an_elastic_range_that_cannot_be_is_refused(nproc: tuple[int, int], nnodes: int, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        pytorch.ddp("t.py", nproc_per_node=nproc, nnodes=nnodes, rdzv_endpoint="10.0.0.1:29400")


# --- sklearn ------------------------------------------------------------------------------


def test_sweep_argv_uses_the_sorted_union_of_keys() -> None:
    params = [{"max_iter": 100, "C": 0.1}, {"C": 1.0, "max_iter": 200}]
    w = sk.sweep("examples/sklearn_sweep.py", params, source="/src", python="python3")
    assert w.argv() == ["python3", "examples/sklearn_sweep.py", "--C", "{C}", "--max_iter", "{max_iter}"]
    assert [w.argv(p) for p in w.task_params or []] == [
        ["python3", "examples/sklearn_sweep.py", "--C", "0.1", "--max_iter", "100"],
        ["python3", "examples/sklearn_sweep.py", "--C", "1.0", "--max_iter", "200"],
    ]
    assert (w.mode, w.resolved_mode(), w.source.path) == ("independent_tasks", "independent_tasks", "/src")
    assert (w.outputs.collect, w.outputs.primary_metric, w.outputs.maximize) == (["metrics.json"], "accuracy_mean",
                                                                                  True)
    params[0]["C"] = 99  # the workload keeps its own copy
    assert w.task_params[0]["C"] == 0.1  # type: ignore[index]


def test_sweep_refuses_parameter_sets_with_different_keys_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"task_params\[0\] \{'lr': 0.1\} has no 'depth': every parameter set "
                                         r"needs the same keys \(depth, lr\)"):
        sk.sweep("trial.py", [{"lr": 0.1}, {"lr": 0.2, "depth": 3}])
    with pytest.raises(ValueError, match=r"task_params\[1\] \{'depth': 3\} has no 'lr'"):
        sk.sweep("trial.py", [{"lr": 0.1, "depth": 1}, {"depth": 3}])
    assert sk.sweep("trial.py", []).task_params == []


def test_sweep_metric_and_direction() -> None:
    w = sk.sweep("s.py", [{"alpha": 1}], metric="rmse", maximize=False)
    assert (w.outputs.primary_metric, w.outputs.maximize, w.argv()[0]) == ("rmse", False, "python")


def test_hpo_is_the_cartesian_product_over_sorted_keys() -> None:
    w = sk.hpo("s.py", {"max_iter": [100, 200], "C": (0.1, 1.0, 10.0)}, metric="f1")
    assert w.task_params == [
        {"C": 0.1, "max_iter": 100}, {"C": 0.1, "max_iter": 200},
        {"C": 1.0, "max_iter": 100}, {"C": 1.0, "max_iter": 200},
        {"C": 10.0, "max_iter": 100}, {"C": 10.0, "max_iter": 200},
    ]
    assert w.argv() == ["python", "s.py", "--C", "{C}", "--max_iter", "{max_iter}"]
    assert w.outputs.primary_metric == "f1"


# --- huggingface ------------------------------------------------------------------------------


def test_trainer_is_single_node_ddp() -> None:
    w = huggingface.trainer("hf.py", source="/p", nproc_per_node=3, script_args="--epochs 1")
    assert w.argv() == ["torchrun", "--nproc-per-node=3", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
                        "hf.py", "--epochs", "1"]
    assert huggingface.trainer("hf.py").argv()[1] == "--nproc-per-node=1"


@pytest.fixture
def fake_transformers(monkeypatch: pytest.MonkeyPatch) -> type:
    """transformers is not installed here: a minimal stand-in with the one base class used."""

    class TrainerCallback:
        pass

    module = types.ModuleType("transformers")
    module.TrainerCallback = TrainerCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", module)
    return TrainerCallback


def _hf_checkpoint(root: Path, step: int) -> Path:
    step_dir = root / f"checkpoint-{step}"
    step_dir.mkdir(parents=True)
    (step_dir / "model.safetensors").write_bytes(b"w" * (100 + step))
    (step_dir / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return step_dir


def test_callback_commits_manifests_and_latest_checkpoint_finds_them(
    fake_transformers: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flashruntime.checkpoint.local import latest_valid_manifest

    monkeypatch.setenv("FLASHML_JOB_ID", "job-1")
    monkeypatch.delenv("FLASHML_ATTEMPT_ID", raising=False)
    callback = huggingface.flashruntime_callback()
    assert isinstance(callback, fake_transformers)
    args = types.SimpleNamespace(output_dir=str(tmp_path), world_size=2)
    control = object()

    assert huggingface.latest_checkpoint(tmp_path) is None
    first = _hf_checkpoint(tmp_path, 10)
    assert callback.on_save(args, types.SimpleNamespace(global_step=10, is_world_process_zero=True), control) is control
    second = _hf_checkpoint(tmp_path, 20)
    callback.on_save(args, types.SimpleNamespace(global_step=20, is_world_process_zero=False), control)
    assert not (second / "manifest.json").exists()  # only the world's rank 0 commits
    assert huggingface.latest_checkpoint(tmp_path) == str(first)

    callback.on_save(args, types.SimpleNamespace(global_step=20, is_world_process_zero=True), control)
    assert huggingface.latest_checkpoint(tmp_path) == str(second)
    manifest = latest_valid_manifest(tmp_path, pattern="checkpoint-*")
    assert manifest is not None
    assert (manifest.job_id, manifest.attempt_id, manifest.step, manifest.framework, manifest.world_size) == (
        "job-1", "local", 20, "transformers", 2)
    assert sorted(p.key for p in manifest.parts) == ["model.safetensors", "trainer_state.json"]

    (second / "model.safetensors").write_bytes(b"truncated")  # no longer verifies: resume the older one
    assert huggingface.latest_checkpoint(tmp_path) == str(first)


def test_latest_checkpoint_holds_from_any_directory_and_after_the_tree_moved(
    fake_transformers: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Trainer's output_dir is often relative ("out"): the manifest records an absolute
    prefix, and latest_checkpoint answers with the directory it found, wherever that is now."""
    from flashruntime.checkpoint.local import latest_valid_manifest

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    _hf_checkpoint(Path("out"), 10)
    callback = huggingface.flashruntime_callback()
    callback.on_save(types.SimpleNamespace(output_dir="out", world_size=1),
                     types.SimpleNamespace(global_step=10, is_world_process_zero=True), None)
    written = tmp_path / "a" / "out" / "checkpoint-10"
    manifest = latest_valid_manifest(written.parent, pattern="checkpoint-*")
    assert manifest is not None and manifest.storage_prefix == str(written)
    assert huggingface.latest_checkpoint("out") == str(written)

    monkeypatch.chdir(tmp_path / "b")
    assert huggingface.latest_checkpoint(tmp_path / "a" / "out") == str(written)
    (tmp_path / "a" / "out").rename(tmp_path / "moved")
    assert huggingface.latest_checkpoint(tmp_path / "moved") == str(tmp_path / "moved" / "checkpoint-10")
    assert huggingface.latest_checkpoint("../moved") == str(tmp_path / "moved" / "checkpoint-10")


def test_callback_skips_a_missing_checkpoint_dir_and_warns_on_an_empty_one(
    fake_transformers: type, tmp_path: Path
) -> None:
    callback = huggingface.flashruntime_callback()
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    callback.on_save(args, types.SimpleNamespace(global_step=5, is_world_process_zero=True), None)  # no dir: no-op
    (tmp_path / "checkpoint-6").mkdir()
    with pytest.warns(RuntimeWarning, match="no manifest for .*checkpoint-6: no checkpoint parts"):
        callback.on_save(args, types.SimpleNamespace(global_step=6, is_world_process_zero=True), None)
    assert huggingface.latest_checkpoint(tmp_path) is None


def test_callback_forwards_logs_with_the_step(
    fake_transformers: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flashruntime.torch import _state

    monkeypatch.setattr(_state, "STATE", _state.HelperState())
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(tmp_path))
    callback = huggingface.flashruntime_callback()
    state = types.SimpleNamespace(global_step=12, is_world_process_zero=True)
    callback.on_log(None, state, None, logs={"loss": 0.75, "learning_rate": 1e-4})
    callback.on_log(None, state, None)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(line.pop("ts"), float) for line in lines)  # every record is stamped
    assert lines == [{"loss": 0.75, "learning_rate": 1e-4, "step": 12}, {"step": 12}]


def test_callback_without_transformers_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it now fails
    with pytest.raises(ImportError):
        huggingface.flashruntime_callback()
