"""Elastic local runs: a job started with ``ranks=(min, max)`` is relaunched with the ranks
this machine has now, down to ``min``, when one is lost for good, and grows back at the next
relaunch when they return.

What a relaunch can have is ``Capacity``: ``max`` slots, less those withdrawn (chaos mode's
``lose_rank`` withdraws a rank's slot, for a while or for the rest of the run), and for a
workload on GPUs no more than its ranks can see (``flashruntime.local.visible_gpus``). The
command is torchrun's (its ``--nproc-per-node`` set to the size chosen; the relaunch owns the
restarts and the machine is one) or a plain ``python`` command, which is started under
torchrun at that size. Checkpoints of ``flashruntime.torch`` load at any size up to
``max`` (``FLASHML_MAX_WORLD_SIZE``) and carry the data's global position, so the smaller or
larger group continues with the samples not seen yet (see ``flashruntime.torch._loader``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import InvalidSubmission
from flashruntime.local.visible_gpus import VisibleGpus
from flashruntime.strategies import LaunchSpec

__all__ = ["MAX_WORLD_SIZE_ENV", "Availability", "Capacity", "ElasticRanks", "argv_at", "parse_ranks", "ranks_words",
           "size_change", "spec_at"]

MAX_WORLD_SIZE_ENV = "FLASHML_MAX_WORLD_SIZE"
# The torchrun options the rewrite reads, each with the shortest prefix argparse takes for it
# unambiguously among torchrun's options ("--n" could be --nnodes, "--ma" --master-addr).
_READ_OPTIONS = {
    "nproc": (("--nproc-per-node", "--nproc_per_node"), "--np"),
    "nnodes": (("--nnodes",), "--nn"),
    "max_restarts": (("--max-restarts", "--max_restarts"), "--max"),
}
_ONE_NODE = ("1", "1:1")
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
    missing), or a ``python`` command run under ``python -m torch.distributed.run --standalone``.
    A torchrun command over several machines (``--nnodes`` other than 1) or with restarts of its
    own (``--max-restarts`` above 0) is refused: the relaunch resizes one machine's ranks."""
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
        name, joined_value, value = token.partition("=")
        option = _read_option(name)
        if option is not None:
            value = value if joined_value else (rest[index + 1] if index + 1 < len(rest) else "")
            width = 1 if joined_value else 2
            if option == "nproc":
                out.append(f"--nproc-per-node={world_size}")
                replaced = True
            else:
                _check_option(option, name, value.strip())
                out.extend(rest[index:index + width])
            index += width
            continue
        joined = not token.startswith("--") and len(token) > 2  # "-r3": a short option with its value
        takes_value = "=" not in token and not joined and token not in _TORCHRUN_SWITCHES
        out.extend(rest[index:index + 2] if takes_value else [token])
        index += 2 if takes_value else 1
    if not replaced:
        out.insert(start, f"--nproc-per-node={world_size}")
    return out


def _read_option(name: str) -> str | None:
    """Which of the options the rewrite reads ``name`` is (argparse takes unique prefixes)."""
    for option, (flags, shortest) in _READ_OPTIONS.items():
        if len(name) >= len(shortest) and any(flag.startswith(name) for flag in flags):
            return option
    return None


def _check_option(option: str, name: str, value: str) -> None:
    """Refuse the torchrun options an elastic local run cannot keep."""
    if option == "nnodes" and value not in _ONE_NODE:
        raise InvalidSubmission(
            f"ranks=(min, max) resizes the ranks of one machine, and torchrun's {name} {value} spreads the job over "
            f"several: drop {name} (or give --nnodes=1), or drop ranks and let torchrun itself resize a multi-node "
            "job with --nnodes=MIN:MAX and a --rdzv-endpoint every node joins")
    # Restarts inside an attempt would bring the group back at its old size, so a rank whose slot
    # is gone fails again until torchrun's budget is spent, and the relaunch that picks a new size
    # comes late. Setting them to 0 without a word would drop the restarts the user asked for (the
    # run's own budget defaults to none), so the number is moved to where it works instead.
    if option == "max_restarts" and value != "0":
        raise InvalidSubmission(
            f"ranks=(min, max) relaunches the command at the size available when ranks are lost, and torchrun's "
            f"{name} {value} would restart them inside the attempt at the old size: drop {name} from the command and "
            f"give the run the restarts instead (max_restarts={value} to submit, --max-restarts {value} to "
            "flashruntime submit)")


@dataclass(frozen=True)
class Availability:
    """What an elastic relaunch can have now: ``count`` ranks (at most ``maximum``), why not
    more (``why``, "" at the maximum), and in how many seconds ``wanted`` ranks can run when
    fewer can now (``back_in``: from the known return of withdrawn slots; None when nothing
    known will bring them back)."""

    count: int
    why: str
    back_in: float | None = None


class Capacity:
    """The ranks a relaunch can have now: ``ranks.maximum`` slots less the withdrawn ones, and
    with ``gpus`` no more than its ranks can see. Thread-safe: chaos mode withdraws from its own
    thread. ``clock``: monotonic seconds (a fake one in tests)."""

    def __init__(self, ranks: ElasticRanks, *, gpus: VisibleGpus | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ranks = ranks
        self.gpus = gpus
        self.clock = clock
        self._lock = threading.Lock()
        self._withdrawn: dict[int, tuple[float | None, str]] = {}  # loss -> (back at, on the clock; why)
        self._losses = 0

    def withdraw(self, why: str, seconds: float | None = None) -> None:
        """One slot is gone: for ``seconds``, or for the rest of the run (None). Each call is a
        loss of its own, whichever rank held the slot."""
        with self._lock:
            self._losses += 1
            self._withdrawn[self._losses] = (None if seconds is None else self.clock() + seconds, why)

    def _gone(self, now: float) -> list[tuple[float | None, str]]:
        with self._lock:
            for slot, (back_at, _) in list(self._withdrawn.items()):
                if back_at is not None and back_at <= now:
                    del self._withdrawn[slot]
            return [self._withdrawn[slot] for slot in sorted(self._withdrawn)]

    def now(self, wanted: int | None = None) -> Availability:
        """How many ranks can run now and why not more; with ``wanted`` (more than can run now),
        when that many can, as far as the withdrawn slots' returns say."""
        now = self.clock()
        gone = self._gone(now)
        count = self.ranks.maximum - len(gone)
        reasons = list(dict.fromkeys(why for _, why in gone))
        usable, gpu_words = (None, "") if self.gpus is None else self.gpus.now()
        if usable is not None and usable < count:
            count = usable
            reasons.append(gpu_words)
        count = max(0, count)
        back_in = None
        if wanted is not None and count < wanted and (usable is None or usable >= wanted):
            returns = sorted(back_at for back_at, _ in gone if back_at is not None)
            short = wanted - (self.ranks.maximum - len(gone))  # the returns needed, GPUs permitting
            if 0 < short <= len(returns):
                back_in = max(0.0, returns[short - 1] - now)
        return Availability(count, "; ".join(reasons), back_in)


def ranks_words(count: int) -> str:
    """``count`` ranks in words: "1 rank", "2 ranks"."""
    return f"{count} rank{'s' if count != 1 else ''}"


def size_change(attempt_id: str, previous: int | None, world: int, maximum: int, why: str) -> str | None:
    """What the ``WORLD_SIZE_CHANGED`` event of an attempt at ``world`` ranks says, after one at
    ``previous`` (None: the first attempt, which may have ``maximum``); None when it is no change.
    ``why``: why fewer than ``maximum`` are available."""
    if previous is None:
        if world == maximum:
            return None
        return f"{attempt_id} starts with {ranks_words(world)} instead of {maximum} (the run's max): {why}"
    if world == previous:
        return None
    head = f"{attempt_id} runs {ranks_words(world)} instead of {previous}"
    if world < previous:
        return f"{head}: {why}"
    if world == maximum:
        return f"{head}: {maximum} of {maximum} ranks available again"
    missing = maximum - world
    return (f"{head}: grew to {world} of max {maximum}, {missing} slot{'s' if missing != 1 else ''} still "
            f"missing ({why})")


def spec_at(spec: LaunchSpec, ranks: ElasticRanks, world_size: int) -> LaunchSpec:
    """``spec`` started with ``world_size`` ranks, each told the largest size the run may be
    relaunched at (``FLASHML_MAX_WORLD_SIZE``), which its checkpoints then load at."""
    return spec.model_copy(update={"argv": argv_at(spec.argv, world_size), "world_size": world_size,
                                   "env": {**spec.env, MAX_WORLD_SIZE_ENV: str(ranks.maximum)}})
