"""Time and cost model (SPEC §7.2): training FLOPs = 6·N·tokens over (world size x dense
throughput x MFU), divided by scaling efficiency, times the documented slowdowns;
cost = hours x GPUs x hourly price.

Each function returns the figure and the arithmetic as text for the candidate's reasons.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashruntime.planner import constants as K


@dataclass(frozen=True)
class Slowdown:
    factor: float
    label: str


def recompute_slowdown() -> Slowdown:
    return Slowdown(K.RECOMPUTE_SLOWDOWN, "activation recompute")


def qlora_slowdown() -> Slowdown:
    return Slowdown(K.QLORA_SLOWDOWN, "NF4 dequantisation")


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


def finetune_minutes(
    params: float,
    tokens: float,
    workers: int,
    tflops: float,
    slowdowns: list[Slowdown],
    efficiency: float,
) -> tuple[float, str]:
    """Wall minutes of a fine-tune, and its arithmetic."""
    flops = K.FLOPS_PER_PARAM_PER_TOKEN * params * tokens
    seconds = flops / (workers * tflops * 1e12 * K.MFU) * combined(slowdowns) / efficiency
    minutes = round(seconds / 60, 2)  # the figure the report carries; text and wire agree
    factors = "".join(f" x {s.factor:.2f} ({s.label})" for s in slowdowns)
    text = (
        f"time {minutes:.0f} min = 6 x {params / 1e9:.2f}e9 params x {tokens / 1e6:g}e6 tokens / "
        f"({workers} x {tflops:g} TFLOP/s x MFU {K.MFU:.2f}){factors} / efficiency {efficiency:.2f}"
    )
    return minutes, text


def gpu_hours_minutes(gpu_hours: float, workers: int, efficiency: float | None) -> tuple[float, str]:
    """Wall minutes from a GPU-hour estimate split over ``workers``."""
    eff = 1.0 if efficiency is None else efficiency
    minutes = round(gpu_hours * 60 / workers / eff, 2)
    scaling = "linear scaling assumed" if efficiency is None else f"efficiency {eff:.2f}"
    return minutes, f"time {minutes:.0f} min = {gpu_hours:g} GPU-h x 60 / {workers} GPUs ({scaling})"


def cost_usd(minutes: float, gpus: int, hourly_usd_per_gpu: float) -> tuple[float, str]:
    cost = round(minutes / 60 * gpus * hourly_usd_per_gpu, 2)
    text = f"cost ${cost:.2f} = {minutes / 60:.2f} h x {gpus} GPU x ${hourly_usd_per_gpu:g}/GPU-h"
    return cost, text
