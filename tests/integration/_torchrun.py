"""Running ``examples/ddp_train.py`` under real torchrun, single-node or as two local
"nodes" joined through c10d; shared by the torch integration tests (no torch import)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests._support import REPO_ROOT

SCRIPT = REPO_ROOT / "examples" / "ddp_train.py"
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID")


def torchrun_argv() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _env(out: Path, ckpt: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV}
    env.update(FLASHML_OUTPUT_DIR=str(out), FLASHML_CKPT_DIR=str(ckpt), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
    return env


def single_node(out: Path, ckpt: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    argv = [*torchrun_argv(), f"--nproc-per-node={nproc}", "--nnodes=1", "--standalone", "--local-addr=127.0.0.1",
            str(SCRIPT), *args]
    return subprocess.run(argv, env=_env(out, ckpt), capture_output=True, text=True, timeout=300, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(tmp: Path, name: str, ckpts: tuple[Path, Path], *args: str) -> list[subprocess.CompletedProcess[str]]:
    """Two torchrun agents on this host joining one c10d rendezvous: 2 x 2 = 4 ranks."""
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = []
    for node, ckpt in enumerate(ckpts):
        argv = [*torchrun_argv(), "--nproc-per-node=2", "--nnodes=2", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}", f"--rdzv-id={name}", "--local-addr=127.0.0.1", str(SCRIPT), *args]
        procs.append(subprocess.Popen(argv, env=_env(tmp / f"{name}-node{node}", ckpt), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return results


def logged_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())
