"""The torch helper end to end under real torchrun (CPU, gloo): ``examples/ddp_train.py`` writes
verified checkpoints, a SIGKILLed run resumes without recomputing checkpointed steps and
ends at the uninterrupted loss, and multi-node ranks restore the step rank 0 selected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.integration._torchrun import final_metrics as _final
from tests.integration._torchrun import logged_steps as _steps
from tests.integration._torchrun import single_node as _single_node
from tests.integration._torchrun import two_nodes as _two_nodes

pytestmark = [pytest.mark.torch, pytest.mark.slow]
torch = pytest.importorskip("torch")


def test_kill_and_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    from flashruntime.checkpoint.local import MANIFEST_NAME, latest_valid_manifest, verify_manifest
    from flashruntime.protocol.v1alpha1 import CheckpointManifest

    args = ("--steps", "12", "--checkpoint-every", "4")
    whole = _single_node(tmp_path / "whole", tmp_path / "ckpt-whole", *args)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpt-whole").iterdir()) == ["step-000004", "step-000008",
                                                                          "step-000012"]
    for step_dir in (tmp_path / "ckpt-whole").iterdir():
        manifest = CheckpointManifest.model_validate_json((step_dir / MANIFEST_NAME).read_text())
        assert verify_manifest(manifest, step_dir)
        assert sorted(p.key for p in manifest.parts) == ["model.pt", "optimizer.pt", "resume.pt"]
        assert (manifest.world_size, manifest.framework) == (2, "pytorch-" + torch.__version__.split("+")[0])
    assert _steps(tmp_path / "whole") == list(range(1, 13))
    for rank in (0, 1):
        beat = json.loads((tmp_path / "whole" / "ranks" / f"rank-{rank}.json").read_text())
        assert (beat["rank"], beat["local_rank"], beat["world_size"], beat["backend"], beat["device"]) == (
            rank, rank, 2, "gloo", "cpu")
        assert beat["step"] == 12  # the last checkpoint forces a heartbeat

    ckpt = tmp_path / "ckpt"
    crashed = _single_node(tmp_path / "crashed", ckpt, *args, "--crash-at-step", "6")
    assert crashed.returncode != 0
    assert _steps(tmp_path / "crashed") == [1, 2, 3, 4, 5, 6]
    assert not (tmp_path / "crashed" / "metrics.json").exists()
    last = latest_valid_manifest(ckpt)
    assert last is not None and last.step == 4

    resumed = _single_node(tmp_path / "resumed", ckpt, *args, "--crash-at-step", "6")  # not fresh: no crash
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _final(tmp_path / "resumed")["start_step"] == 4
    assert _steps(tmp_path / "resumed") == list(range(5, 13))  # nothing at or before step 4 recomputed
    assert abs(_final(tmp_path / "resumed")["final_loss"] - _final(tmp_path / "whole")["final_loss"]) <= 1e-6
    assert latest_valid_manifest(ckpt).step == 12  # type: ignore[union-attr]


def test_two_nodes_match_one_node_and_refuse_unshared_checkpoints(tmp_path: Path) -> None:
    args = ("--steps", "6", "--checkpoint-every", "3")
    single = _single_node(tmp_path / "single", tmp_path / "ckpt-single", *args, nproc=4)
    assert single.returncode == 0, single.stderr[-3000:]

    shared = tmp_path / "ckpt-shared"
    nodes = _two_nodes(tmp_path, "pair", (shared, shared), *args)
    assert [r.returncode for r in nodes] == [0, 0], "\n".join(r.stdout[-2000:] for r in nodes)
    written = [tmp_path / f"pair-node{i}" for i in (0, 1) if (tmp_path / f"pair-node{i}" / "metrics.json").exists()]
    finals = [_final(out) for out in written]
    assert len(finals) == 1  # only global rank 0 writes it, on whichever node the rendezvous made first
    assert finals[0]["world_size"] == 4
    assert abs(finals[0]["final_loss"] - _final(tmp_path / "single")["final_loss"]) <= 1e-6

    # Each node sees a different checkpoint: whichever step rank 0 picks, the other node lacks it.
    own = (tmp_path / "ckpt-a", tmp_path / "ckpt-b")
    shutil.copytree(shared / "step-000003", own[0] / "step-000003")
    shutil.copytree(shared / "step-000006", own[1] / "step-000006")
    refused = _two_nodes(tmp_path, "split", own, *args)
    assert all(r.returncode != 0 for r in refused)
    logs = "\n".join(r.stdout for r in refused)
    assert "CheckpointError" in logs
    assert "multi-node resume needs a checkpoint_dir visible to every participant" in logs
