"""Time and cost model: training FLOPs = 6·N·tokens over (world size x dense
throughput x MFU), divided by scaling efficiency, times the documented slowdowns;
cost = hours x GPUs x hourly price.

Each function returns the figure and the arithmetic as text for the candidate's reasons. A
time under a minute is carried to three significant digits and shown in seconds, so a short
run never reads "0 min".
"""

from __future__ import annotations

import math
from typing import NamedTuple

from flashruntime.planner import constants as K


class Slowdown(NamedTuple):
    """A multiplicative slowdown and what causes it (immutable; a tuple is cheap on the hot path)."""

    factor: float
    label: str


RECOMPUTE = Slowdown(K.RECOMPUTE_SLOWDOWN, "activation recompute")
QLORA = Slowdown(K.QLORA_SLOWDOWN, "NF4 dequantisation")
_MFU_TEXT = f"{K.MFU:.2f}"


def shown_minutes(exact: float) -> float:
    """The minutes a report carries: 2 decimals, or 3 significant digits under a minute."""
    if 0 < exact < 1:
        return float(f"{exact:.3g}")
    return round(exact, 2)


def duration_text(minutes: float) -> str:
    """``96 min``, or seconds under a minute (``7.25 s``)."""
    if minutes < 1:
        return f"{minutes * 60:.3g} s"
    return f"{minutes:.0f} min"


def cpu_optimizer_slowdown(trainable_params: float, step_compute_s: float) -> Slowdown:
    """The host-side Adam step, memory-bound at the host's bandwidth, serialised after backward."""
    cpu_seconds = trainable_params * K.CPU_ADAM_BYTES_PER_PARAM / K.HOST_MEMORY_BYTES_PER_S
    factor = 1.0 + (cpu_seconds / step_compute_s if step_compute_s > 0 else 0.0)
    return Slowdown(factor, "CPU optimizer step")


def combined(slowdowns: list[Slowdown]) -> float:
    factor = 1.0
    for slowdown in slowdowns:
        factor *= slowdown.factor
    return factor


def step_compute_seconds(params: float, tokens_per_step: float, tflops: float, slowdown: float) -> float:
    """Seconds one GPU computes for one optimizer step (its micro-batches x grad_accum)."""
    return K.FLOPS_PER_PARAM_PER_TOKEN * params * tokens_per_step / (tflops * 1e12 * K.MFU) * slowdown


def factors_text(slowdowns: list[Slowdown]) -> str:
    """`` x 1.33 (activation recompute)`` per slowdown, as the time arithmetic shows them."""
    return "".join([f" x {s.factor:.2f} ({s.label})" for s in slowdowns])


class FineTuneClock:
    """Wall time of one fine-tune at any world size; the world-size-independent FLOPs and text
    are computed once per request."""

    __slots__ = ("_flops", "_middle", "_tflops_text", "tflops")

    def __init__(self, params: float, tokens: float, tflops: float) -> None:
        self.tflops = tflops
        self._flops = K.FLOPS_PER_PARAM_PER_TOKEN * params * tokens
        self._middle = f" = 6 x {params / 1e9:.2f}e9 params x {tokens / 1e6:g}e6 tokens / ("
        self._tflops_text = f" x {tflops:g} TFLOP/s x MFU {_MFU_TEXT})"

    def minutes(self, workers: int, slowdown: float, factors: str, efficiency: float) -> tuple[float, str, float]:
        """``(shown minutes, arithmetic, exact minutes)``; ``slowdown`` is ``combined`` of the slowdowns
        that ``factors`` (``factors_text``) lists."""
        seconds = self._flops / (workers * self.tflops * 1e12 * K.MFU) * slowdown
        # efficiency 0 (or NaN) only comes from overflowed communication estimates: no finite time
        seconds = seconds / efficiency if efficiency > 0 else math.inf
        exact = seconds / 60
        minutes = shown_minutes(exact)  # the figure the report carries; text and wire agree
        text = "time %s%s%s%s%s / efficiency %.2f" % (
            duration_text(minutes),
            self._middle,
            workers,
            self._tflops_text,
            factors,
            efficiency,
        )
        return minutes, text, exact


def gpu_hours_minutes(gpu_hours: float, workers: int, efficiency: float | None) -> tuple[float, str, float]:
    """``(shown minutes, arithmetic, exact minutes)`` of a GPU-hour estimate split over ``workers``."""
    eff = 1.0 if efficiency is None else efficiency
    exact = gpu_hours * 60 / workers / eff
    minutes = shown_minutes(exact)
    scaling = "linear scaling assumed" if efficiency is None else f"efficiency {eff:.2f}"
    text = f"time {duration_text(minutes)} = {gpu_hours:g} GPU-h x 60 / {workers} GPUs ({scaling})"
    return minutes, text, exact


def cost_usd(
    minutes: float, gpus: int, hourly_usd_per_gpu: float, exact_minutes: float | None = None
) -> tuple[float, str, float]:
    """``(shown cost, arithmetic, exact cost)`` on ``gpus`` GPUs for ``minutes`` as the report shows
    them (the arithmetic quotes those) and ``exact_minutes`` as computed (None: the same). The report
    shows cents; the budget and the balanced band compare the exact cost."""
    exact = (minutes if exact_minutes is None else exact_minutes) / 60 * gpus * hourly_usd_per_gpu
    cost = round(exact, 2)
    text = "cost $%.2f = %.2f h x %s GPU x $%g/GPU-h" % (cost, minutes / 60, gpus, hourly_usd_per_gpu)
    return cost, text, exact
