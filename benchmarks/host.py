"""The host block of a result file: what machine, software and filesystem produced it.

``fs`` is the filesystem type of the directory a run wrote to, read from
/proc/mounts, so a storage figure measured on tmpfs is visible as such.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

# Absolute targets were set on the 2-core, 24 GiB development machine, so only a host like it judges them.
REFERENCE_CORES = 2
REFERENCE_RAM_GB = (20.0, 28.0)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _gpu() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.replace("\n", ", ") or None


def torch_importable() -> bool:
    """Whether ``import torch`` works in this process (a scenario's torch rows skip otherwise)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def filesystem_type(path: str | Path) -> str:
    """Type of the filesystem holding ``path`` (longest matching mount point)."""
    target = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best_type
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fields[2]
    return best_type


def host_info(work_dir: str | Path) -> dict[str, Any]:
    from flashruntime import __version__

    return {
        "hostname": platform.node(),
        "os": f"{platform.system()}-{platform.release()}",
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "gpu": _gpu(),
        "flashruntime": __version__,
        "fs": filesystem_type(work_dir),
    }


def is_reference_host(host: dict[str, Any]) -> bool:
    """Whether targets may be judged here (override: FLASHRUNTIME_BENCH_REFERENCE_HOST=1/0)."""
    override = os.environ.get("FLASHRUNTIME_BENCH_REFERENCE_HOST")
    if override in ("0", "1"):
        return override == "1"
    ram = host.get("ram_gb") or 0.0
    return host.get("cores") == REFERENCE_CORES and REFERENCE_RAM_GB[0] <= ram <= REFERENCE_RAM_GB[1]
