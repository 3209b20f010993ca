"""``flashruntime submit --api URL CMD`` end to end: a real coordinator with tokens, two real
``flashruntime worker --runner trusted`` processes of one team pool, and the same sweep run
locally beside it. The source directory travels as an upload that honours ``.gitignore``; the
live output, the table of trials, the best trial and the exit code are those of the local run;
a submitter without the code-execution grant is refused with the coordinator's reason, and
nothing of it is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import process_env, serve_in_thread, settings_for, stop_process

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

TOKENS = {
    "FLASHML_NODE_TOKENS": "box-1:tok-box-1,box-2:tok-box-2",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice,bob:tok-bob",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
    "FLASHML_ARGV_SUBMITTERS": "alice",
    "FLASHML_NODE_POOLS": "box-1:team-7,box-2:team-7",
    "FLASHML_UNSANDBOXED_NODES": "box-1,box-2",
}
ROOT = {"Authorization": "Bearer tok-root"}
# A loss that depends on the learning rate; it fails on purpose for lr 0.5. It says whether the
# ignored file reached its working directory.
TRAIN = """\
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
lr = parser.parse_args().lr
out = os.environ["FLASHML_OUTPUT_DIR"]
print(f"lr={lr} big.bin here: {os.path.exists('big.bin')}", flush=True)
if lr == 0.5:
    print(f"lr={lr} diverged", flush=True)
    sys.exit(3)
loss = 1.0
with open(os.path.join(out, "metrics.jsonl"), "w") as steps:
    for step in range(3):
        loss = round((lr - 0.03) ** 2 + 1.0 / (step + 2), 6)
        print(f"lr={lr} step {step} loss {loss}", flush=True)
        steps.write(json.dumps({"step": step, "loss": loss}) + "\\n")
with open(os.path.join(out, "metrics.json"), "w") as final:
    json.dump({"loss": loss, "lr": lr}, final)
"""
SWEEP = [{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.03}, {"lr": 0.3}]
HANG_GUARD_S = 240


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A coordinator with tokens and two workers of team pool team-7, for the whole module."""
    base = tmp_path_factory.mktemp("fleet")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in TOKENS.items():
            patch.setenv(name, value)
        with serve_in_thread(settings_for(base / "data")) as url:
            workers = [subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(base / f"w{n}"),
                 "--token", f"tok-box-{n}", "--runner", "trusted", "--pools", "team-7", "--poll-seconds", "0.2"],
                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in (1, 2)]
            try:
                yield {"url": url, "base": base}
            finally:
                for worker in workers:
                    stop_process(worker)


def _project(root: Path) -> Path:
    """A git work tree with train.py, and a big file .gitignore leaves out."""
    root.mkdir()
    (root / "train.py").write_text(TRAIN, encoding="utf-8")
    (root / ".gitignore").write_text("big.bin\n", encoding="utf-8")
    (root / "big.bin").write_bytes(os.urandom(1 << 20))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _submit(project: Path, *options: str, token: str | None = None, runs: Path) -> subprocess.CompletedProcess[str]:
    env = process_env(FLASHML_RUNS_DIR=str(runs), **({"FLASHML_TOKEN": token} if token else {}))
    return subprocess.run([sys.executable, "-m", "flashruntime.cli", *options], cwd=project, env=env, check=False,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def _table(stdout: str) -> list[tuple[Any, ...]]:
    """The rows of the sweep's table as (best, lr, state, loss, attempts); trial ids and durations differ."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["trial", "lr"])
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("state:"):
            break
        cells = line.split()
        best = cells[0] == "*"
        _, lr, state, loss, _, attempts = cells[1:] if best else cells
        rows.append((best, lr, state, loss, attempts))
    return rows


def _field(stdout: str, name: str) -> str:
    return next(line[len(name) + 2:] for line in stdout.splitlines() if line.startswith(f"{name}: "))


def _sweep(fleet: dict[str, Any], project: Path, params: list[dict[str, float]], runs: Path) -> tuple[Any, Any]:
    command = ["submit", "python train.py --lr {lr}", "--task-params", json.dumps(params), "--metric", "loss"]
    remote = _submit(project, "--api", fleet["url"], *command, "--pool", "team-7", token="tok-alice", runs=runs)
    local = _submit(project, *command, "--no-watch", runs=runs)
    return remote, local


def test_a_sweep_on_the_fleet_reads_as_the_same_sweep_run_here(fleet: dict[str, Any], tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    remote, local = _sweep(fleet, project, SWEEP, tmp_path / "runs")
    assert local.returncode == 0, local.stderr
    assert remote.returncode == local.returncode, remote.stdout + remote.stderr

    # The live output: every trial's lines, each under its task's tag, as they came.
    for index, params in enumerate(SWEEP):
        assert f"[task-{index:03d}] lr={params['lr']} step 2 loss" in remote.stdout, remote.stdout
        assert f"[task-{index:03d}] lr={params['lr']} big.bin here: False" in remote.stdout
        assert f"lr={params['lr']} step 2 loss" in local.stdout
    assert "trial 1/4 task-000 started on box-" in remote.stdout

    # The table, the best trial and the summary: those of the local run.
    assert _table(remote.stdout) == _table(local.stdout)
    assert _table(remote.stdout)[0][1] == "0.03"  # best first: the loss is lowest at lr 0.03
    assert json.loads(_field(remote.stdout, "best")) == json.loads(_field(local.stdout, "best"))
    assert json.loads(_field(remote.stdout, "best"))["params"] == {"lr": 0.03}
    assert _field(remote.stdout, "state") == _field(local.stdout, "state") == "SUCCEEDED"
    assert _field(remote.stdout, "trials") == _field(local.stdout, "trials") == "4"

    # The ignored file never left this machine: no worker's directory holds it.
    job_id = _field(remote.stdout, "job").split()[0]
    assert list(fleet["base"].glob(f"w*/{job_id}/*/*/inputs/source/train.py"))
    assert not list(fleet["base"].glob("w*/**/big.bin"))
    nodes = {row["node_id"] for row in httpx.get(f"{fleet['url']}/v1alpha1/jobs/{job_id}/tasks", headers=ROOT).json()}
    assert nodes <= {"box-1", "box-2"}

    listed = _submit(project, "--api", fleet["url"], "jobs", token="tok-alice", runs=tmp_path / "runs")
    assert listed.returncode == 0 and job_id in listed.stdout and "alice" in listed.stdout, listed.stdout


def test_a_failing_sweep_exits_as_it_does_here(fleet: dict[str, Any], tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    remote, local = _sweep(fleet, project, [{"lr": 0.1}, {"lr": 0.5}], tmp_path / "runs")
    assert local.returncode == 1, local.stdout + local.stderr
    assert remote.returncode == local.returncode, remote.stdout + remote.stderr
    assert [row[1:3] for row in _table(remote.stdout)] == [row[1:3] for row in _table(local.stdout)] == [
        ("0.1", "SUCCEEDED"), ("0.5", "FAILED")]
    assert _field(remote.stdout, "state") == _field(local.stdout, "state") == "FAILED"
    assert "[task-001] lr=0.5 diverged" in remote.stdout
    assert "task-001 FAILED after 1 attempt(s)" in remote.stderr and "lr=0.5 diverged" in remote.stderr


def test_a_submitter_without_the_grant_is_refused_and_nothing_is_stored(fleet: dict[str, Any], tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    refused = _submit(project, "--api", fleet["url"], "submit", "python train.py --lr 0.1", "--pool", "team-7",
                      token="tok-bob", runs=tmp_path / "runs")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert ("403 Forbidden: this job runs commands on the fleet, and submitter 'bob' may not run code: running "
            "commands is a separate permission; ask the coordinator's operator to add the name to "
            "FLASHML_ARGV_SUBMITTERS") in refused.stderr
    jobs = httpx.get(f"{fleet['url']}/v1alpha1/jobs", headers=ROOT).json()
    assert not [job for job in jobs if (job.get("submitted_by") or {}).get("name") == "bob"]
    assert not (fleet["base"] / "data" / "artifacts" / "users" / "bob").exists()
