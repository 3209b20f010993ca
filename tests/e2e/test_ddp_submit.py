"""The main job end to end with real torchrun and gloo on CPU: kill-and-resume,
multi-node through c10d, no orphans on cancel, fail-fast on bugs."""

from __future__ import annotations

import io
import json
import os
import socket
import time
from pathlib import Path

import pytest

from tests._support import REPO_ROOT, pid_alive

pytestmark = [pytest.mark.torch, pytest.mark.slow]
torch = pytest.importorskip("torch")

from benchmarks.faults import kill_child  # noqa: E402
from flashruntime.integrations.pytorch import ddp  # noqa: E402
from flashruntime.launchers import LaunchState  # noqa: E402
from flashruntime.sdk import submit  # noqa: E402

EXAMPLE = str(REPO_ROOT / "examples" / "ddp_train.py")
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN_ARGS = "--steps 30 --checkpoint-every 10"


def _steps(attempt_dir: Path) -> list[int]:
    path = attempt_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kill_and_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = submit(ddp(EXAMPLE, nproc_per_node=2, script_args=TRAIN_ARGS), output_dir=tmp_path / "ref",
                       watch=False)
    assert reference.state is LaunchState.SUCCEEDED, reference.logs()

    workload = ddp(EXAMPLE, nproc_per_node=2, script_args=TRAIN_ARGS + " --sleep-per-step 0.15")
    run = submit(workload, output_dir=tmp_path / "run", max_restarts=1, wait=False, watch=False)
    ckpt = tmp_path / "run" / "local" / "ckpt"

    def after_first_checkpoint(row: dict) -> bool:
        return (ckpt / "step-000010" / "manifest.json").exists()

    assert kill_child(run, after_first_checkpoint, timeout_s=120, target="rank")
    assert run.wait(timeout=300) is LaunchState.SUCCEEDED, run.logs()

    assert [a["attempt_id"] for a in run.attempts] == ["task-000", "task-000-r1"]
    assert run.attempts[0]["state"] == "FAILED"
    events = json.loads(run.run_json_path.read_text())["events"]
    by_type = {e["type"]: e["message"] for e in events}
    assert by_type["FAILURE_CLASSIFIED"].startswith("task-000: worker_crash")
    assert by_type["RECOVERY_ACTION_SELECTED"].startswith("task-000: restart_group — ")
    resumed_from = int(by_type["RESUME_SELECTED"].split("resumes from step ")[1].split()[0])
    assert resumed_from >= 10

    resumed_steps = _steps(tmp_path / "run" / "local" / "task-000-r1")
    assert resumed_steps[0] == resumed_from + 1 and min(resumed_steps) > resumed_from  # nothing redone
    assert run.trials[-1]["start_step"] == resumed_from
    assert run.trials[-1]["final_loss"] == pytest.approx(reference.trials[-1]["final_loss"], abs=1e-6)


def test_deterministic_failure_in_ranks_is_not_relaunched(tmp_path: Path) -> None:
    stream = io.StringIO()
    run = submit(ddp(str(SCRIPTS / "import_error_ddp.py"), nproc_per_node=2), output_dir=tmp_path,
                 max_restarts=2, watch=False, stream=stream)
    assert run.state is LaunchState.FAILED
    assert len(run.attempts) == 1
    # The ranks' lines reach the stream tagged by torchrun, and each rank keeps its own log.
    shown = stream.getvalue()
    assert "[default0]:ModuleNotFoundError" in shown and "[default1]:ModuleNotFoundError" in shown
    assert list((tmp_path / "local" / "task-000" / "rank-logs").rglob("stderr.log"))
    summary = run.failure_summary()
    assert "error     ModuleNotFoundError: No module named 'flashruntime_e2e_missing_module'" in summary
    assert "rank      local rank " in summary and "ChildFailedError" not in summary
    events = json.loads(run.run_json_path.read_text())["events"]
    classified = [e["message"] for e in events if e["type"] == "FAILURE_CLASSIFIED"]
    actions = [e["message"] for e in events if e["type"] == "RECOVERY_ACTION_SELECTED"]
    assert classified[0].startswith("task-000: application_error") and "ModuleNotFoundError" in classified[0]
    assert actions[0].startswith("task-000: fail_job — ")


def test_cancel_leaves_no_rank_alive_even_one_ignoring_sigterm(tmp_path: Path) -> None:
    run = submit(ddp(str(SCRIPTS / "stubborn_ddp.py"), nproc_per_node=2), output_dir=tmp_path, wait=False,
                 max_restarts=2, watch=False)
    pids_dir = tmp_path / "local" / "task-000" / "pids"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(pids_dir.glob("rank-?"))) < 2:
        assert not run.state.terminal, run.logs()
        time.sleep(0.1)
    ranks = [int(p.read_text()) for p in sorted(pids_dir.glob("rank-?"))]
    leader = int(run.attempts[0]["pid"])
    assert len(ranks) == 2 and all(pid_alive(p) for p in ranks)
    run.cancel()
    assert run.wait(timeout=120) is LaunchState.CANCELLED
    assert not any(pid_alive(p) for p in [*ranks, leader])
    assert len(run.attempts) == 1  # no restart after a cancel


def test_multi_node_c10d_matches_a_single_node_run(tmp_path: Path) -> None:
    args = "--steps 12 --checkpoint-every 0"
    single = submit(ddp(EXAMPLE, nproc_per_node=4, script_args=args), output_dir=tmp_path / "single", watch=False)
    assert single.state is LaunchState.SUCCEEDED, single.logs()

    endpoint = f"127.0.0.1:{_free_port()}"
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    nodes = [
        submit(ddp(EXAMPLE, nproc_per_node=2, nnodes=2, rdzv_endpoint=endpoint, rdzv_id="e2e", script_args=args,
                   env=env),
               output_dir=tmp_path / f"node{i}", checkpoint_dir=tmp_path / "shared-ckpt", wait=False, watch=False)
        for i in range(2)
    ]
    for node in nodes:
        assert node.wait(timeout=300) is LaunchState.SUCCEEDED, node.logs()
    trials = [t for node in nodes for t in node.trials]
    assert len(trials) == 1  # only global rank 0 writes metrics.json
    assert trials[0]["world_size"] == 4
    assert trials[0]["final_loss"] == pytest.approx(single.trials[-1]["final_loss"], abs=1e-6)


def test_sklearn_sweep_picks_the_best_trial(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    from flashruntime.integrations import sklearn as sk

    workload = sk.sweep(str(REPO_ROOT / "examples" / "sklearn_sweep.py"),
                        [{"C": 0.0001}, {"C": 1.0}, {"C": 0.001}], metric="accuracy_mean", python=os.sys.executable)
    run = submit(workload, output_dir=tmp_path, watch=False)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    assert [t["params"]["C"] for t in run.trials] == [0.0001, 1.0, 0.001]
    scores = [t["accuracy_mean"] for t in run.trials]
    assert len(set(scores)) == 3
    best = run.best_trial()
    assert best is not None and best["accuracy_mean"] == max(scores) and best["params"] == {"C": 1.0}
