"""Per-rank compute time: how long a rank works on a step before it waits for the others.

DDP ranks end their steps together (the gradient all-reduce waits for the slowest one), so
wall step times cannot tell a straggler. What differs is the time from the moment a rank is
released (the optimizer's step, or the end of ``log_metrics``/``checkpoint``) to the moment its
last gradient is accumulated, after which it only waits on the all-reduce. ``prepare`` hooks
every parameter's grad accumulation and the optimizer's step; the recent times go into the
rank's heartbeat. Host clock only; nothing here imports torch.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["KEPT", "ComputeClock", "attach", "boundary", "close_sample", "recent", "take_first_full"]

KEPT = 20  # times kept for the heartbeat: twice the watcher's detection window of 10 steps
# The heartbeat is written at once when this many times are in, so the first full detection
# window is seen without waiting for the one-per-second throttle.
FIRST_FULL = 10

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass
class ComputeClock:
    """What this process measured; ``perf_counter`` readings."""

    released: float | None = None  # the last moment the rank was free to compute
    last_grad: float | None = None  # the newest gradient accumulated since
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    first_full_taken: bool = False
    hooked: set[int] = field(default_factory=set)  # ids of the parameters and optimizers already hooked


CLOCK = ComputeClock()


def close_sample(released: float | None, last_grad: float | None) -> float | None:
    """Pure: the compute time of the step that ended, or None when no gradient came in since
    the rank was released (a second boundary call in one step, or a step without backward)."""
    if released is None or last_grad is None or last_grad <= released:
        return None
    return last_grad - released


def release(clock: ComputeClock, now: float) -> None:
    """A boundary: the step measured so far is closed and the next one starts at ``now``."""
    sample = close_sample(clock.released, clock.last_grad)
    if sample is not None:
        clock.samples.append(sample)
    clock.released = now


def _grad_ready(_param: Any) -> None:
    CLOCK.last_grad = time.perf_counter()


def _optimizer_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
    release(CLOCK, time.perf_counter())


def attach(model: Any, optimizer: Any = None) -> None:
    """Hook ``model``'s trainable parameters (each accumulated gradient stamps the clock) and
    ``optimizer``'s step (a boundary). A DDP comm hook would see the same moment, but DDP takes
    only one and a script may register its own. Never raises: timing must not stop training."""
    try:
        for param in model.parameters():
            if getattr(param, "requires_grad", False) and id(param) not in CLOCK.hooked:
                param.register_post_accumulate_grad_hook(_grad_ready)
                CLOCK.hooked.add(id(param))
        if optimizer is not None and id(optimizer) not in CLOCK.hooked:
            optimizer.register_step_pre_hook(_optimizer_step)
            CLOCK.hooked.add(id(optimizer))
    except Exception:  # noqa: BLE001, S110 - without hooks the rank reports no compute times, and trains on
        pass
    release(CLOCK, time.perf_counter())


def boundary(function: _F) -> _F:
    """Decorate a step-boundary call (``log_metrics``, ``checkpoint``): its own time, and a
    barrier's wait inside it, count as no rank's compute."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        release(CLOCK, time.perf_counter())
        try:
            return function(*args, **kwargs)
        finally:
            CLOCK.released = time.perf_counter()
    return wrapper  # type: ignore[return-value]


def recent() -> list[float]:
    """The kept compute times, oldest first, in seconds rounded to microseconds."""
    return [round(sample, 6) for sample in CLOCK.samples]


def take_first_full() -> bool:
    """True once: the first time ``FIRST_FULL`` times are in (the heartbeat forces a write)."""
    if CLOCK.first_full_taken or len(CLOCK.samples) < FIRST_FULL:
        return False
    CLOCK.first_full_taken = True
    return True
