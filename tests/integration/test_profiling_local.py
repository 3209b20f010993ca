"""``LocalProfiler`` on the CPU DDP example under real torchrun and gloo: what it measures,
that it writes nothing where the real job keeps its output or checkpoints, and that a hung
or crashed command becomes a ``ProfileError``."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from flashruntime.errors import ProfileError
from flashruntime.profiling import LocalProfiler
from tests._support import REPO_ROOT
from tests.integration._torchrun import SCRIPT, single_node, torchrun_argv

ARGS = ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05"]


def _env() -> dict[str, str]:
    # The ranks import this checkout's flashruntime, not an installed one.
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": "1"}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*"))


@pytest.mark.torch
@pytest.mark.slow
def test_the_ddp_example_is_measured_in_isolation_close_to_its_normal_run(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    normal = single_node(tmp_path / "normal-out", tmp_path / "normal-ckpt", *ARGS)
    assert normal.returncode == 0, normal.stderr[-2000:]
    stamps = [json.loads(line)["ts"] for line in (tmp_path / "normal-out" / "metrics.jsonl").read_text().splitlines()]
    steady = statistics.median(b - a for a, b in itertools.pairwise(stamps[5:]))

    # The profile runs where a real job is configured: its output and checkpoint directories
    # (named by the environment, as inside a run) must not change.
    job_out, job_ckpt = tmp_path / "job-out", tmp_path / "job-ckpt"
    job_out.mkdir()
    job_ckpt.mkdir()
    (job_ckpt / "keep.txt").write_text("the job's own")
    monkeypatch.setenv("FLASHML_OUTPUT_DIR", str(job_out))
    monkeypatch.setenv("FLASHML_CKPT_DIR", str(job_ckpt))
    before = _files(job_out) + _files(job_ckpt)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    command = [*torchrun_argv(), "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
               str(SCRIPT), *ARGS]
    result = LocalProfiler(command, warmup_steps=3, measured_steps=10, workdir=workdir,
                           env=_env()).profile(None, None, budget_seconds=120)

    assert _files(job_out) + _files(job_ckpt) == before and _files(workdir) == []
    assert result.basis == "profiled" and (result.strategy_family, result.workers) == ("cpu_ddp", 2)
    assert (result.measured_steps, result.warmup_steps) == (10, 3)
    assert result.peak_vram_gb is None and result.device == "cpu" and 0 < result.host_ram_gb < 8
    assert result.checkpoint_save_s > 0 and result.checkpoint_restore_s > 0 and result.checkpoint_size_gb > 0
    assert 0 <= result.dataloader_wait_fraction < 1
    # A generous bound, not a benchmark (this host's pace varies 1.6-2x for minutes at a time):
    # the measurement is of the same order as the normal run's steady state.
    assert 0.5 < result.step_time_s / steady < 2.0, (result.step_time_s, steady)


def test_a_hung_command_is_cut_at_its_budget(tmp_path: Path) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    profiler = LocalProfiler([sys.executable, str(hang)], workdir=tmp_path)
    with pytest.raises(ProfileError, match=r"cut at its budget of 1\.5 s after no step of 3 warm-up \+ 10 "
                                           r"measured; raise budget_seconds(?s:.*)loading"):
        profiler.profile(None, None, budget_seconds=1.5)


def test_a_crashed_command_reports_its_exit_code_and_log(tmp_path: Path) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nprint('bad data', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(ProfileError, match=r"exited with code 3(?s:.*)bad data"):
        LocalProfiler([sys.executable, str(crash)], workdir=tmp_path).profile(None, None, budget_seconds=60)


def test_a_command_without_steps_measures_nothing(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.py"
    quiet.write_text("print('done')\n")
    with pytest.raises(ProfileError, match=r"ended before its measured steps were done.*ft\.log_metrics"):
        LocalProfiler([sys.executable, str(quiet)], workdir=tmp_path).profile(None, None, budget_seconds=60)


@pytest.mark.torch
def test_a_plan_with_profile_true_carries_profiled_figures_of_the_example(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import flashruntime as flash

    command = [*torchrun_argv(), "--nproc-per-node=2", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
               str(SCRIPT), *ARGS]
    request = {"workload": {"kind": "pytorch_training", "parameters_m": 0.0003},
               "resources": {"gpus": 0, "cpu_cores": 2}}
    report = flash.plan(request, profile=True, command=command, steps=1_000, budget_seconds=120, mtbf_s=86_400)
    ddp = next(c for c in report.candidates if c.name == "cpu_ddp_x2")
    assert ddp.est_time_min.basis == "profiled", report.warnings
    assert report.selected.strategy_family == "cpu_ddp" and report.selected.est_time_min.basis == "profiled"
    assert any(r.endswith("s/step profiled on the CPU") for r in ddp.reasons), ddp.reasons
    assert report.selected.checkpoint.note.startswith("Young/Daly: ")
