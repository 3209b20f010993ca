"""Elastic local runs: a job started with ``ranks=(min, max)`` is relaunched with the ranks
this machine has now, down to ``min``, when one is lost for good, and grows back at the next
relaunch when they return.

What a relaunch can have is ``Capacity``: ``max`` slots, less those withdrawn (chaos mode's
``lose_rank`` withdraws a rank's slot, for a while or for the rest of the run), and on a
machine with NVIDIA GPUs no more than ``nvidia-smi`` lists. The command is torchrun's (its
``--nproc-per-node`` set to the size chosen) or a plain ``python`` command, which is started
under torchrun at that size. Checkpoints of ``flashruntime.torch`` load at any size up to
``max`` (``FLASHML_MAX_WORLD_SIZE``) and carry the data's global position, so the smaller or
larger group continues with the samples not seen yet (see ``flashruntime.torch._loader``).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import InvalidSubmission
from flashruntime.strategies import LaunchSpec

__all__ = ["MAX_WORLD_SIZE_ENV", "Capacity", "ElasticRanks", "argv_at", "parse_ranks", "spec_at"]

MAX_WORLD_SIZE_ENV = "FLASHML_MAX_WORLD_SIZE"
_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")
# torchrun's options that take no value; every other option takes one (``--flag=V`` or ``--flag V``).
_TORCHRUN_SWITCHES = frozenset({"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python",
                                "--run-path", "--run_path", "--virtual-local-rank", "--virtual_local_rank"})
_MOST_RANKS = 4096


@dataclass(frozen=True)
class ElasticRanks:
    """The world sizes a run may have: from ``minimum`` to ``maximum`` ranks."""

    minimum: int
    maximum: int

    def words(self) -> str:
        return f"{self.minimum}..{self.maximum} ranks"


def parse_ranks(value: Any) -> ElasticRanks | None:
    """``ranks`` as given to ``submit`` (``(min, max)``, ``"MIN:MAX"``, or one number), checked."""
    if value is None:
        return None
    raw = value
    if isinstance(value, str):
        pieces = value.split(":")
        if len(pieces) not in (1, 2) or not all(piece.strip().isdigit() for piece in pieces):
            raise InvalidSubmission(f"ranks {value!r} is not MIN:MAX: give two whole numbers such as '1:2' "
                                    "(the fewest ranks the run may continue on, and the most it starts with)")
        value = tuple(int(piece) for piece in pieces) * (2 if len(pieces) == 1 else 1)
    elif isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in value)):
        raise InvalidSubmission(f"ranks must be (min, max) or 'MIN:MAX', e.g. (1, 2); got {raw!r}")
    low, high = (value[0], value[-1])
    if not 1 <= low <= high <= _MOST_RANKS:
        raise InvalidSubmission(f"ranks {raw!r} must satisfy 1 <= min <= max <= {_MOST_RANKS}, e.g. (1, 2)")
    return ElasticRanks(low, high)


def _torchrun_at(argv: list[str]) -> int | None:
    """Where torchrun's own options start in ``argv`` (after ``torchrun`` or ``python -m
    torch.distributed.run``), None when it is not a torchrun command."""
    if argv and Path(argv[0]).name == "torchrun":
        return 1
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1:3] == ["-m", "torch.distributed.run"]:
        return 3
    return None


def argv_at(argv: list[str], world_size: int) -> list[str]:
    """``argv`` started with ``world_size`` ranks: torchrun's ``--nproc-per-node`` set (added when
    missing), or a ``python`` command run under ``python -m torch.distributed.run --standalone``."""
    start = _torchrun_at(argv)
    if start is None:
        if not argv or not Path(argv[0]).name.startswith("python") or len(argv) < 2 or (
                argv[1].startswith("-") and argv[1] != "-m"):
            shown = " ".join(argv[:3])
            raise InvalidSubmission(
                f"ranks=(min, max) relaunches the command at another world size, so it must be a torchrun or a "
                f"plain python command ('torchrun --nproc-per-node 2 train.py' or 'python train.py'); got {shown!r}")
        return [argv[0], "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}", *argv[1:]]
    out = list(argv[:start])
    rest = argv[start:]
    index, replaced = 0, False
    while index < len(rest):
        token = rest[index]
        if not token.startswith("-"):  # the script: torchrun's options have ended
            out.extend(rest[index:])
            break
        if token == "--":
            raise InvalidSubmission("ranks=(min, max) sets torchrun's --nproc-per-node, which a '--' before the "
                                    "script hides: drop the '--'")
        name = token.split("=", 1)[0]
        if len(name) >= len("--nproc") and any(flag.startswith(name) for flag in _NPROC_FLAGS):  # argparse prefixes
            out.append(f"--nproc-per-node={world_size}")
            replaced = True
            index += 1 if "=" in token else 2
            continue
        joined = not token.startswith("--") and len(token) > 2  # "-r3": a short option with its value
        takes_value = "=" not in token and not joined and token not in _TORCHRUN_SWITCHES
        out.extend(rest[index:index + 2] if takes_value else [token])
        index += 2 if takes_value else 1
    if not replaced:
        out.insert(start, f"--nproc-per-node={world_size}")
    return out


def _gpus_listed() -> int | None:
    """How many GPUs ``nvidia-smi`` lists now, None without it (or when it cannot say)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return 0  # a driver that cannot list its devices has none to give
    return sum(1 for line in done.stdout.splitlines() if line.strip())


class Capacity:
    """The ranks a relaunch can have now: ``ranks.maximum`` slots less the withdrawn ones, and
    with ``gpus`` no more than the GPUs listed. Thread-safe: chaos mode withdraws from its own
    thread."""

    def __init__(self, ranks: ElasticRanks, *, gpus: bool = False) -> None:
        self.ranks = ranks
        self._gpus = gpus
        self._lock = threading.Lock()
        self._withdrawn: dict[int, tuple[float | None, str]] = {}  # loss -> (back at, monotonic; why)
        self._losses = 0

    def withdraw(self, why: str, seconds: float | None = None) -> None:
        """One slot is gone: for ``seconds``, or for the rest of the run (None). Each call is a
        loss of its own, whichever rank held the slot."""
        with self._lock:
            self._losses += 1
            self._withdrawn[self._losses] = (None if seconds is None else time.monotonic() + seconds, why)

    def _gone(self) -> dict[int, str]:
        now = time.monotonic()
        with self._lock:
            for slot, (back_at, _) in list(self._withdrawn.items()):
                if back_at is not None and back_at <= now:
                    del self._withdrawn[slot]
            return {slot: why for slot, (_, why) in self._withdrawn.items()}

    def available(self) -> tuple[int, str]:
        """How many ranks can run now (at most ``maximum``), and why not more."""
        gone = self._gone()
        count = self.ranks.maximum - len(gone)
        reasons = list(dict.fromkeys(why for _, why in sorted(gone.items())))
        if self._gpus:
            listed = _gpus_listed()
            if listed is not None and listed < count:
                count = listed
                reasons.append(f"nvidia-smi lists {listed} GPU{'s' if listed != 1 else ''}")
        return max(0, count), "; ".join(reasons)


def spec_at(spec: LaunchSpec, ranks: ElasticRanks, world_size: int) -> LaunchSpec:
    """``spec`` started with ``world_size`` ranks, each told the largest size the run may be
    relaunched at (``FLASHML_MAX_WORLD_SIZE``), which its checkpoints then load at."""
    return spec.model_copy(update={"argv": argv_at(spec.argv, world_size), "world_size": world_size,
                                   "env": {**spec.env, MAX_WORLD_SIZE_ENV: str(ranks.maximum)}})
