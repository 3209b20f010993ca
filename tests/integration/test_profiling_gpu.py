"""``LocalProfiler`` on CUDA: the example's peak is read from the CUDA allocator
(``peak_vram_gb``). Skips cleanly without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashruntime.profiling import LocalProfiler
from tests._support import REPO_ROOT
from tests.integration._torchrun import SCRIPT, torchrun_argv

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.slow]


def test_the_cuda_peak_is_measured(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        pytest.skip("no CUDA device visible")
    nproc = min(2, torch.cuda.device_count())
    command = [*torchrun_argv(), f"--nproc-per-node={nproc}", "--nnodes=1", "--standalone",
               "--local-addr=127.0.0.1", str(SCRIPT), "--steps", "40", "--checkpoint-every", "0"]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = LocalProfiler(command, warmup_steps=2, measured_steps=5, workdir=tmp_path,
                           env=env).profile(None, None, budget_seconds=240)
    assert result.device == "cuda:0" and result.workers == nproc
    assert result.strategy_family == ("single_gpu" if nproc == 1 else "ddp")  # GPU families on CUDA only
    assert result.peak_vram_gb is not None and 0 < result.peak_vram_gb < 80
    assert result.checkpoint_save_s is not None and result.checkpoint_restore_s is not None
