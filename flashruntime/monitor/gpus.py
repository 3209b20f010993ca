"""GPU rows from ``nvidia-smi`` (``[]`` when it is missing or fails).

One query per tick, bounded by a timeout; values nvidia-smi cannot report
(``[N/A]``) become null rather than zero.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

QUERY = "name,utilization.gpu,memory.used,memory.total"
TIMEOUT_SECONDS = 5.0


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(output: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits``."""
    rows: list[dict[str, Any]] = []
    for line in output.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not fields[0]:
            continue
        used, total = _number(fields[2]), _number(fields[3])
        rows.append({
            "name": fields[0],
            "util_percent": _number(fields[1]),
            "mem_used_mb": int(used) if used is not None else None,
            "mem_total_mb": int(total) if total is not None else None,
        })
    return rows


def query_gpus(executable: str | None = None) -> list[dict[str, Any]]:
    """The visible GPUs now; ``[]`` without nvidia-smi or when it fails."""
    exe = executable or shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []
