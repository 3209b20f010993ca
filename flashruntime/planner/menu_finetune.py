"""Candidate menu for ``transformer_finetune``: single GPU, then DDP, FSDP2
and ZeRO-3 CPU offload at each world size, plus ``qlora_`` variants of a LoRA request,
with activation checkpointing switched on only where it is what makes a candidate fit.
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import NO_TIME_NOTE, Candidate, Knobs, Memory, Miss
from flashruntime.planner.catalog_gpus import GpuFacts
from flashruntime.planner.catalog_models import ModelShape, resolve_model
from flashruntime.planner.checks import MemoryBand, apply_efficiency, apply_host_ram, apply_objective
from flashruntime.planner.comms import Link, mb_text
from flashruntime.planner.libraries import Library, training_libraries
from flashruntime.planner.memory import SHARDED_FAMILIES, FineTune, FineTuneBytes, activation_bytes
from flashruntime.planner.topology import fits_one_host, gpus_on_busiest_host, same_host_link_warning, world_sizes
from flashruntime.planner.unplannable import UnplannableRequest
from flashruntime.protocol.plan_v1alpha1 import Objective, Resources, TransformerFineTune


def finetune_candidates(
    wl: TransformerFineTune, res: Resources, obj: Objective, gpu: GpuFacts | None, warnings: list[str]
) -> list[Candidate]:
    """Every candidate for a transformer fine-tune, each with its verdict and arithmetic."""
    shape = resolve_model(wl.model, parameters_b=wl.parameters_b, hidden_size=wl.hidden_size, num_layers=wl.num_layers)
    if res.gpus < 1:
        raise UnplannableRequest(
            f"a transformer fine-tune of {wl.model!r} needs at least one GPU, but resources.gpus = {res.gpus}. "
            f"Set resources.gpus >= 1 (and resources.gpu_type or resources.vram_gb)"
        )
    if gpu is None:
        raise UnplannableRequest(
            f"a transformer fine-tune of {wl.model!r} needs the GPU's memory: set resources.gpu_type "
            f"(a catalog GPU) or resources.vram_gb"
        )
    link_note = same_host_link_warning(res)
    if link_note:
        warnings.append(link_note)
    if shape.derived:
        warnings.append(
            f"{wl.model}: {', '.join(shape.derived)} not known; assumed from N ≈ 12·L·h², h = 128·L, "
            f"head dim {K.DEFAULT_HEAD_DIM}, vocab {K.DEFAULT_VOCAB} - pass hidden_size and num_layers for accuracy"
        )
    if wl.precision == "bf16" and not gpu.has_bf16:
        warnings.append(f"{gpu.label} has no bf16 tensor cores: set precision 'fp16' (estimates assume fp16 speed)")
    if gpu.tflops(wl.precision) is None:
        warnings.append(f"{gpu.label}: throughput unknown (not in the GPU catalog), so {NO_TIME_NOTE}")
    if wl.train_tokens_m is None:
        warnings.append(f"workload.train_tokens_m not set: {NO_TIME_NOTE}")
    elif res.hourly_cost_usd_per_gpu is None:
        warnings.append("resources.hourly_cost_usd_per_gpu not set: no cost estimates")

    shared = _Shared(wl, res, obj, gpu, shape)
    methods = [wl.method]
    if wl.method == "lora" and obj.allow_quantization:
        methods.append("qlora")
    out: list[Candidate] = []
    for method in methods:
        m = _Method(shared, shape, method)
        for workers in shared.sizes:
            for family in _families(workers, method, obj):
                out.append(_evaluate(shared, m, family, workers))
    return out


class _Shared:
    """What every candidate of one request shares, derived once per ``plan`` call."""

    __slots__ = ("band", "clock", "colocated", "gpu", "link", "obj", "on_host", "res", "sizes", "tflops", "wl")

    def __init__(self, wl: TransformerFineTune, res: Resources, obj: Objective, gpu: GpuFacts, shape: ModelShape):
        self.wl, self.res, self.obj, self.gpu = wl, res, obj, gpu
        self.band = MemoryBand(gpu.vram_gb)
        self.link = Link(res.interconnect)
        self.sizes = world_sizes(res.gpus)
        self.colocated = {w: fits_one_host(w, res) for w in self.sizes}
        self.on_host = {w: gpus_on_busiest_host(w, res) for w in self.sizes}
        self.tflops = gpu.tflops(wl.precision)
        self.clock: timing.FineTuneClock | None = None
        if self.tflops is not None and wl.train_tokens_m is not None:
            self.clock = timing.FineTuneClock(shape.params, wl.train_tokens_m * 1e6, self.tflops)


class _Method:
    """One fine-tuning method (the request's, or its QLoRA variant): the model's byte counts,
    activations and per-GPU step time, which no family or world size changes."""

    __slots__ = (
        "_pace",
        "_setup",
        "_tflops",
        "acts",
        "bytes",
        "ft",
        "grad_text",
        "peft",
        "prefix",
        "quantization",
    )

    def __init__(self, shared: _Shared, shape: ModelShape, method: str) -> None:
        wl = shared.wl
        self.prefix = "qlora_" if method == "qlora" and wl.method == "lora" else ""
        self.ft = ft = FineTune(
            shape=shape,
            method=method,
            precision=wl.precision,
            optimizer=wl.optimizer,
            lora_rank=wl.lora_rank,
            seq_len=wl.seq_len,
            micro_batch=wl.micro_batch_per_gpu,
            grad_accum=wl.grad_accum,
            train_tokens=None if wl.train_tokens_m is None else wl.train_tokens_m * 1e6,
        )
        self.bytes = FineTuneBytes(ft)
        # Indexed by activation checkpointing (False, True).
        self.acts = (activation_bytes(ft, False), activation_bytes(ft, True))
        self.quantization = "nf4" if method == "qlora" else None
        self.peft = f"lora(r={ft.lora_rank})" if method in ("lora", "qlora") else None
        self.grad_text = mb_text(self.bytes.grads)
        self._tflops = shared.tflops
        # Per-call dedup, filled on first use and dropped with this object at the end of the plan() call:
        # knobs and libraries depend only on the family and checkpointing, the step time only on
        # checkpointing (memory is deduplicated by FineTuneBytes).
        self._pace: dict[bool, tuple[float, float, str]] = {}
        self._setup: dict[tuple[str, bool], tuple[Knobs, tuple[Library, ...]]] = {}

    def pace(self, ackpt: bool) -> tuple[float, float, str]:
        """(compute seconds per optimizer step, combined slowdown, the slowdowns as text); needs throughput."""
        pace = self._pace.get(ackpt)
        if pace is None:
            ft = self.ft
            applied: list[timing.Slowdown] = []
            if ackpt:
                applied.append(timing.RECOMPUTE)
            if ft.method == "qlora":
                applied.append(timing.QLORA)
            slowdown = timing.combined(applied)
            tokens_per_step = float(ft.micro_batch) * ft.seq_len * ft.grad_accum
            step_s = timing.step_compute_seconds(ft.shape.params, tokens_per_step, self._tflops, slowdown)
            pace = self._pace[ackpt] = (step_s, slowdown, timing.factors_text(applied))
        return pace

    def setup(self, family: str, ackpt: bool) -> tuple[Knobs, tuple[Library, ...]]:
        """The knobs and libraries of this method's ``family`` candidates (shared by their world sizes;
        nothing mutates them after the menu)."""
        key = (family, ackpt)
        setup = self._setup.get(key)
        if setup is None:
            ft = self.ft
            knobs = Knobs(
                ft.precision,
                self.quantization,
                self.peft,
                ft.micro_batch,
                ft.grad_accum,
                ackpt,
                "optimizer_cpu" if family == "zero3_cpu_offload" else "none",
            )
            setup = self._setup[key] = (knobs, training_libraries(family, knobs, ft.optimizer))
        return setup


def _families(workers: int, method: str, obj: Objective) -> list[str]:
    if workers == 1:
        return ["single_gpu"]
    families = ["ddp"]
    if method != "qlora":
        families.append("fsdp2")
    if obj.allow_cpu_offload:
        families.append("zero3_cpu_offload")
    return families


def _evaluate(s: _Shared, m: _Method, family: str, workers: int) -> Candidate:
    wl, band, ft = s.wl, s.band, m.ft
    usable = band.usable_gb  # a memory estimate fits at or under this (0.95 x VRAM)
    base_name = f"{m.prefix}{family}" if workers == 1 else f"{m.prefix}{family}_x{workers}"
    # Activation checkpointing: forced by the request, or switched on only when it is what makes the fit.
    if wl.activation_checkpointing is not None:
        ackpt = wl.activation_checkpointing
        mem = m.bytes.memory(family, workers, m.acts[ackpt])
        note = f"activation checkpointing {'on' if ackpt else 'off'} as requested"
        name = base_name
    else:
        plain = m.bytes.memory(family, workers, m.acts[False])
        if plain.total_gb <= usable:
            ackpt, mem, note, name = False, plain, "", base_name
        else:
            ackpt = True
            mem = m.bytes.memory(family, workers, m.acts[True])
            if mem.total_gb <= usable:
                note = "activation checkpointing on: %.1f GB without it" % plain.total_gb
                name = base_name + "+ackpt"
            else:
                note = "even with activation checkpointing; %.1f GB without it" % plain.total_gb
                name = base_name
    knobs, libraries = m.setup(family, ackpt)
    c = Candidate(
        name,
        family,
        workers,
        "torchrun",
        "local" if family == "single_gpu" else "coordinated_training",
        1,
        s.colocated[workers],
        knobs=knobs,
        libraries=libraries,
    )
    if ft.method == "qlora" and not s.obj.allow_quantization:
        # ratio 1: one switch admits it; a memory or host-RAM miss recorded later replaces this one
        c.reject(
            "rejected_policy",
            "method 'qlora' quantises the base model, but objective.allow_quantization is false",
            Miss(1.0, "set objective.allow_quantization true or use method 'lora'"),
        )
    band.apply(c, mem, note)
    if c.miss is not None and family in SHARDED_FAMILIES and not mem.total_gb <= usable:
        wider = gpus_to_fit(mem, workers, band.vram_gb)
        if wider is not None:
            c.miss.fix += f", or about {wider} such GPUs with {family}"
    if family == "zero3_cpu_offload":
        on_host = s.on_host[workers]
        apply_host_ram(c, mem.cpu_offload_gb * on_host, s.res.cpu_ram_gb, f"offloaded states of {on_host} GPU(s)")
    _estimate_time(c, s, m, family, workers, ackpt, mem.weights_gb)
    if c.status == "feasible":
        apply_objective(c, s.obj)
    return c


def gpus_to_fit(mem: Memory, workers: int, vram_gb: float) -> int | None:
    """World size at which a sharded candidate's states would fit, activations and buffers staying put."""
    sharded = (mem.weights_gb + mem.gradients_gb + mem.optimizer_gb) * workers
    usable = K.BAND_INFEASIBLE_ABOVE * vram_gb - K.CUDA_CONTEXT_BYTES / K.GIB
    per_gpu = usable / (1 + K.FRAGMENTATION_FRACTION) - mem.activations_gb - mem.transient_gb
    if per_gpu <= 0 or not math.isfinite(sharded / per_gpu):
        return None
    return max(workers + 1, math.ceil(sharded / per_gpu))


def _estimate_time(
    c: Candidate, s: _Shared, m: _Method, family: str, workers: int, ackpt: bool, weights_gb: float
) -> None:
    if s.tflops is None:
        c.no_time(f"throughput of {s.gpu.label} unknown")
        return
    ft = m.ft
    step_s, slowdown, factors = m.pace(ackpt)
    host_bytes = 0.0
    if family == "zero3_cpu_offload":
        trainable = ft.trainable_params
        host_bytes = K.OFFLOAD_HOST_BYTES_PER_PARAM * trainable / workers
        cpu = timing.cpu_optimizer_slowdown(trainable * s.on_host[workers] / workers, step_s)
        # combined() multiplies left to right, so appending a factor is one more multiplication.
        slowdown *= cpu.factor
        factors += timing.factors_text([cpu])
        step_s *= cpu.factor
    if workers > 1:
        efficiency, comm_text = s.link.step(
            step_s,
            family,
            workers,
            m.bytes.grads,
            weights_gb * K.GIB * (workers if family in SHARDED_FAMILIES else 1),
            ft.grad_accum,
            ft.shape.layers,
            host_bytes,
            m.grad_text,
        )
        apply_efficiency(c, efficiency, comm_text)
    else:
        efficiency = 1.0
        c.efficiency = 1.0
    if s.clock is None:
        c.no_time("workload.train_tokens_m not set")
        return
    minutes, time_text, exact = s.clock.minutes(workers, slowdown, factors, efficiency)
    c.set_time(minutes, time_text, exact)
    hourly = s.res.hourly_cost_usd_per_gpu
    if hourly is not None:
        c.set_cost(*timing.cost_usd(minutes, workers, hourly, exact))
