"""The torchrun the benchmarks' comparator arms and launches run: the one beside this Python."""

from __future__ import annotations

import sys
from pathlib import Path


def torchrun_argv() -> list[str]:
    """``torchrun`` beside ``sys.executable``, else ``python -m torch.distributed.run``."""
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]
