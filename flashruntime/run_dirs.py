"""Where local runs live when no ``output_dir`` is given: one directory per run under a
per-user root that outlives reboots, which ``flashruntime runs`` lists and under which the
calibration ledger is kept. Standard library only, so every program can find the root."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

__all__ = ["RUNS_DIR_ENV", "new_run_dir", "runs_root"]

RUNS_DIR_ENV = "FLASHML_RUNS_DIR"


def runs_root() -> Path:
    """``$FLASHML_RUNS_DIR``, else the platform's user data directory + ``flashruntime/runs``:
    ``$XDG_DATA_HOME`` or ``~/.local/share`` on Linux, ``~/Library/Application Support`` on
    macOS, ``%LOCALAPPDATA%`` on Windows."""
    configured = os.environ.get(RUNS_DIR_ENV, "").strip()
    if configured:
        return Path(os.path.expanduser(configured)).resolve()
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "").strip()
        base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return (base / "flashruntime" / "runs").resolve()


def new_run_dir(root: Path | None = None, now: float | None = None) -> Path:
    """A new, empty run directory ``<root>/<UTC yyyymmdd-HHMMSS>-<6 hex>``: sorts by start
    time, and the random part keeps two runs started in the same second apart."""
    root = runs_root() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    while True:
        candidate = root / f"{stamp}-{uuid.uuid4().hex[:6]}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
