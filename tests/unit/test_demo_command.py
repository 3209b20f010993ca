"""``flashruntime demo``'s workload: the DDP demo runs on CPU ranks even
where GPUs are visible; the parent's environment is left alone."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from flashruntime.cli.demo import demo_workload
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LocalProcessLauncher
from flashruntime.strategies.command import compile_workload


def test_ddp_demo_hides_gpus_from_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    spec = compile_workload(demo_workload(ddp=True, crash=True))
    assert spec.argv[0] == "torchrun" and spec.world_size == 2
    assert spec.env == {"CUDA_VISIBLE_DEVICES": ""}
    # Through the launcher, the job sees no GPU while this process keeps its own setting.
    probe = spec.model_copy(update={"argv": [sys.executable, "-c",
                                             "import json, os; print(json.dumps(os.environ['CUDA_VISIBLE_DEVICES']))"]})
    handle = LocalProcessLauncher(tmp_path).launch(probe, "local", "task-000")
    assert handle.wait() is LaunchState.SUCCEEDED
    assert json.loads(handle.logs().strip()) == ""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_cpu_demo_leaves_the_environment_alone() -> None:
    assert compile_workload(demo_workload(ddp=False, crash=False)).env == {}
