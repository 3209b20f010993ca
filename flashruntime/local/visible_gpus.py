"""The GPUs an elastic run's ranks can use: those ``nvidia-smi`` lists, narrowed to the ones
``CUDA_VISIBLE_DEVICES`` names (the workload's own, else this process's), as CUDA reads it.

``usable_gpus`` is the pure decision; ``VisibleGpus`` asks ``nvidia-smi`` each time it is read,
so a relaunch sees a GPU that fell off the bus, or came back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VISIBLE_ENV", "VisibleGpus", "nvidia_smi_gpus", "usable_gpus", "visible_entries"]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
Listed = list[tuple[int, str]]  # (index, UUID) of each GPU nvidia-smi lists


def nvidia_smi_gpus() -> Listed | None:
    """The GPUs ``nvidia-smi`` lists now, None without it (or when it cannot say)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return []  # a driver that cannot list its devices has none to give
    listed: Listed = []
    for line in done.stdout.splitlines():
        index, _, uuid = (part.strip() for part in line.partition(","))
        if index.isdigit():
            listed.append((int(index), uuid))
    return listed


def visible_entries(visible: str) -> list[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value that can name a device, up to the first
    that cannot (CUDA ignores it and every entry after it): indices, ``GPU-`` and ``MIG-`` UUIDs."""
    entries = []
    for entry in (piece.strip() for piece in visible.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def _plural(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def usable_gpus(visible: str | None, listed: Listed | None) -> tuple[int | None, str]:
    """How many GPUs the ranks can use, and why that many (None, "" when nothing says).

    Without ``visible`` (the variable unset): every GPU listed. With it: the devices its entries
    name, each once, up to the first entry that names none (CUDA stops there): an index below
    the number listed, or a UUID (or its prefix) of a listed GPU. A MIG instance's UUID is
    counted as it stands: ``nvidia-smi``'s GPU list does not show MIG instances. Without a
    listing the entries are counted as they stand."""
    if visible is None:
        return (None, "") if listed is None else (len(listed), f"nvidia-smi lists {_plural(len(listed))}")
    named: list[str] = []
    for entry in visible_entries(visible):
        if listed is None or entry.startswith("MIG-"):
            device = entry
        elif entry.isdigit():  # CUDA's own numbering: any index below the count names a device
            device = "" if int(entry) >= len(listed) else (sorted(listed)[int(entry)][1] or entry)
        else:
            device = next((uuid for _, uuid in listed if uuid.startswith(entry)), "")
        if not device:
            break  # an entry naming no device hides every entry after it
        if device not in named:
            named.append(device)
    shown = f"{VISIBLE_ENV}={visible!r}"
    if listed is None:
        return len(named), f"{shown} names {_plural(len(named))}"
    return len(named), f"{shown} makes {len(named)} of the {_plural(len(listed))} nvidia-smi lists visible"


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs of a run whose ranks use them: ``visible`` is the ``CUDA_VISIBLE_DEVICES`` its
    ranks start with (None when unset), ``listing`` how the machine's GPUs are read."""

    visible: str | None
    listing: Callable[[], Listed | None] = field(default=nvidia_smi_gpus, compare=False)

    @classmethod
    def of(cls, gpus: int | None, env: Mapping[str, str], process_env: Mapping[str, Any] | None = None,
           ) -> VisibleGpus | None:
        """For a workload asking for ``gpus`` with ``env``: None for a CPU workload (no GPUs asked
        for and none named in its own env), whose ranks no GPU count limits."""
        process_env = os.environ if process_env is None else process_env
        own = env.get(VISIBLE_ENV)
        if not (gpus or 0) > 0 and not (own is not None and visible_entries(own)):
            return None
        visible = own if own is not None else process_env.get(VISIBLE_ENV)
        return cls(None if visible is None else str(visible))

    def now(self) -> tuple[int | None, str]:
        """How many the ranks can use now, and why (see ``usable_gpus``)."""
        return usable_gpus(self.visible, self.listing())
