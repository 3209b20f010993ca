"""``every="auto"`` for ``checkpoint``: the Young/Daly interval ``sqrt(2 x C x MTBF)`` from
the save cost C this process measured on its own saves and a mean time between failures
(``mtbf_s``, else ``$FLASHML_CHECKPOINT_MTBF_S``, else one day), turned into steps with the
measured step time.

The first checkpoint is saved at the second step the call sees, to measure C; from then on
a checkpoint is due when ``interval_steps`` steps have passed since the last one. C is the
median of the saves so far and the step time the median of recent steps (a step that saved
counts without its save). With several ranks, rank 0 measures and broadcasts both at each
save, which every rank makes together, so every rank decides the same steps.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from flashruntime.errors import InvalidProfileRequest
from flashruntime.torch import _state

MTBF_ENV = "FLASHML_CHECKPOINT_MTBF_S"
DEFAULT_MTBF_S = 86_400.0  # one day: a single machine's order of magnitude, when nothing better is known
_RECENT = 64  # steps and saves the medians are taken over: recent enough to follow a change of pace


@dataclass(frozen=True)
class Cadence:
    """The interval in force: ``interval_s = sqrt(2 x checkpoint_s x mtbf_s)`` and
    ``interval_steps = max(1, round(interval_s / step_time_s))``."""

    checkpoint_s: float
    step_time_s: float
    mtbf_s: float
    interval_s: float
    interval_steps: int


@dataclass
class AutoState:
    """What the auto cadence has measured in this process."""

    saves_s: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    steps_s: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    last_call: tuple[int, float] | None = None  # (step, perf_counter) at the end of the last call
    first_step: int | None = None
    last_saved_step: int | None = None
    cadence: Cadence | None = None


AUTO = AutoState()


def mtbf(mtbf_s: float | None) -> float:
    """``mtbf_s``, else ``$FLASHML_CHECKPOINT_MTBF_S``, else ``DEFAULT_MTBF_S``; a positive number of seconds."""
    if mtbf_s is None:
        raw = os.environ.get(MTBF_ENV, "").strip()
        if not raw:
            return DEFAULT_MTBF_S
        try:
            mtbf_s = float(raw)
        except ValueError:
            raise InvalidProfileRequest(
                f"{MTBF_ENV}={raw!r} is not a number; set it to the mean seconds between failures, e.g. 86400"
            ) from None
    ok = isinstance(mtbf_s, (int, float)) and not isinstance(mtbf_s, bool) and math.isfinite(mtbf_s) and mtbf_s > 0
    if not ok:
        raise InvalidProfileRequest(
            f"mtbf_s must be the mean seconds between failures, a finite number > 0 (e.g. 86400), got {mtbf_s!r}"
        )
    return float(mtbf_s)


def cadence(checkpoint_s: float, step_time_s: float, mtbf_s: float) -> Cadence:
    """Young/Daly's interval for save cost ``checkpoint_s``, in seconds and in steps of ``step_time_s``
    (at least one step: a free save is made every step)."""
    interval_s = math.sqrt(2.0 * max(0.0, checkpoint_s) * mtbf_s)
    steps = max(1, round(interval_s / step_time_s)) if step_time_s > 0 else 1
    return Cadence(checkpoint_s, step_time_s, mtbf_s, interval_s, steps)


def due(step: int) -> bool:
    """Whether ``step`` is due under the auto cadence; also times the step since the last call."""
    now = time.perf_counter()
    if AUTO.last_call is not None and step > AUTO.last_call[0]:
        AUTO.steps_s.append((now - AUTO.last_call[1]) / (step - AUTO.last_call[0]))
    AUTO.last_call = (step, now)
    if AUTO.first_step is None:
        AUTO.first_step = step
    if AUTO.last_saved_step is None:
        return step > AUTO.first_step  # the first save, to measure C, once one step is timed
    if AUTO.cadence is None or step <= AUTO.last_saved_step:
        return False
    return step - AUTO.last_saved_step >= AUTO.cadence.interval_steps


def saved(step: int, save_s: float | None, mtbf_s: float) -> Cadence:
    """After the save of ``step`` (``save_s`` measured on rank 0, None elsewhere): agree on C and
    the step time across ranks, and set the cadence from them."""
    if save_s is not None:
        AUTO.saves_s.append(save_s)
    measured = [statistics.median(AUTO.saves_s) if AUTO.saves_s else 0.0,
                statistics.median(AUTO.steps_s) if AUTO.steps_s else 0.0]
    measured = _from_rank_zero(measured)
    AUTO.cadence = cadence(measured[0], measured[1], mtbf_s)
    AUTO.last_saved_step = step
    if AUTO.last_call is not None:  # the next step's time is counted from here, without the save
        AUTO.last_call = (AUTO.last_call[0], time.perf_counter())
    return AUTO.cadence


def _from_rank_zero(values: list[float]) -> list[float]:
    if _state.world_size() <= 1:
        return values
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    device = _state.device() if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return [float(v) for v in tensor.tolist()]
