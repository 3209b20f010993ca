"""Candidate menu for ``transformer_finetune`` (SPEC §7.3): single GPU, then DDP, FSDP2
and ZeRO-3 CPU offload at each world size, plus ``qlora_`` variants of a LoRA request,
with activation checkpointing switched on only where it is what makes a candidate fit.
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import Candidate, Knobs, Memory
from flashruntime.planner.catalog_gpus import GpuFacts
from flashruntime.planner.catalog_models import resolve_model
from flashruntime.planner.checks import apply_efficiency, apply_host_ram, apply_memory_band, apply_objective, fits
from flashruntime.planner.comms import StepTraffic, scaling_efficiency, step_communication
from flashruntime.planner.libraries import training_libraries
from flashruntime.planner.memory import SHARDED_FAMILIES, FineTune, activation_bytes, finetune_memory
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
        warnings.append(f"{gpu.label}: throughput unknown (not in the GPU catalog), so no time or cost estimates")
    if wl.train_tokens_m is None:
        warnings.append("workload.train_tokens_m not set: no time or cost estimates")
    elif res.hourly_cost_usd_per_gpu is None:
        warnings.append("resources.hourly_cost_usd_per_gpu not set: no cost estimates")

    methods = [wl.method]
    if wl.method == "lora" and obj.allow_quantization:
        methods.append("qlora")
    out: list[Candidate] = []
    for method in methods:
        prefix = "qlora_" if method == "qlora" and wl.method == "lora" else ""
        ft = FineTune(
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
        # Activations depend on the method's shape and batch only, not on the family: computed once.
        acts = {False: activation_bytes(ft, False), True: activation_bytes(ft, True)}
        for workers in world_sizes(res.gpus):
            for family in _families(workers, method, obj):
                out.append(_evaluate(ft, acts, prefix, family, workers, wl, res, obj, gpu))
    return out


def _families(workers: int, method: str, obj: Objective) -> list[str]:
    if workers == 1:
        return ["single_gpu"]
    families = ["ddp"]
    if method != "qlora":
        families.append("fsdp2")
    if obj.allow_cpu_offload:
        families.append("zero3_cpu_offload")
    return families


def _evaluate(
    ft: FineTune,
    acts: dict[bool, float],
    prefix: str,
    family: str,
    workers: int,
    wl: TransformerFineTune,
    res: Resources,
    obj: Objective,
    gpu: GpuFacts,
) -> Candidate:
    base_name = f"{prefix}{family}" if workers == 1 else f"{prefix}{family}_x{workers}"
    # Activation checkpointing: forced by the request, or switched on only when it is what makes the fit.
    if wl.activation_checkpointing is not None:
        ackpt = wl.activation_checkpointing
        mem = finetune_memory(ft, family, workers, ackpt, activations=acts[ackpt])
        note = f"activation checkpointing {'on' if ackpt else 'off'} as requested"
        name = base_name
    else:
        plain = finetune_memory(ft, family, workers, False, activations=acts[False])
        if fits(plain, gpu.vram_gb):
            ackpt, mem, note, name = False, plain, "", base_name
        else:
            ackpt = True
            mem = finetune_memory(ft, family, workers, True, activations=acts[True])
            if fits(mem, gpu.vram_gb):
                note = f"activation checkpointing on: {plain.total_gb:.1f} GB without it"
                name = f"{base_name}+ackpt"
            else:
                note = f"even with activation checkpointing; {plain.total_gb:.1f} GB without it"
                name = base_name
    knobs = Knobs(
        precision=ft.precision,
        quantization="nf4" if ft.method == "qlora" else None,
        peft=f"lora(r={ft.lora_rank})" if ft.method in ("lora", "qlora") else None,
        micro_batch_per_gpu=ft.micro_batch,
        grad_accum=ft.grad_accum,
        activation_checkpointing=ackpt,
        offload="optimizer_cpu" if family == "zero3_cpu_offload" else "none",
    )
    c = Candidate(
        name=name,
        family=family,
        workers=workers,
        launcher="torchrun",
        workload_mode="local" if family == "single_gpu" else "coordinated_training",
        gpus_per_worker=1,
        colocated=fits_one_host(workers, res),
        knobs=knobs,
        libraries=training_libraries(family, knobs, ft.optimizer),
    )
    if ft.method == "qlora" and not obj.allow_quantization:
        c.reject(
            "rejected_policy", "method 'qlora' quantises the base model, but objective.allow_quantization is false"
        )
    apply_memory_band(c, mem, gpu.vram_gb, note)
    if c.miss is not None and family in SHARDED_FAMILIES and not fits(mem, gpu.vram_gb):
        wider = gpus_to_fit(mem, workers, gpu.vram_gb)
        if wider is not None:
            c.miss.fix += f", or about {wider} such GPUs with {family}"
    if family == "zero3_cpu_offload":
        on_host = gpus_on_busiest_host(workers, res)
        apply_host_ram(c, mem.cpu_offload_gb * on_host, res.cpu_ram_gb, f"offloaded states of {on_host} GPU(s)")
    _estimate_time(c, ft, family, workers, ackpt, mem.weights_gb, res, gpu)
    if c.feasible:
        apply_objective(c, obj)
    return c


def gpus_to_fit(mem: Memory, workers: int, vram_gb: float) -> int | None:
    """World size at which a sharded candidate's states would fit, activations and buffers staying put."""
    sharded = (mem.weights_gb + mem.gradients_gb + mem.optimizer_gb) * workers
    usable = K.BAND_INFEASIBLE_ABOVE * vram_gb - K.CUDA_CONTEXT_BYTES / K.GIB
    per_gpu = usable / (1 + K.FRAGMENTATION_FRACTION) - mem.activations_gb - mem.transient_gb
    if per_gpu <= 0:
        return None
    return max(workers + 1, math.ceil(sharded / per_gpu))


def _estimate_time(
    c: Candidate,
    ft: FineTune,
    family: str,
    workers: int,
    ackpt: bool,
    weights_gb: float,
    res: Resources,
    gpu: GpuFacts,
) -> None:
    tflops = gpu.tflops(ft.precision)
    if tflops is None:
        c.reasons.append(f"no time estimate: throughput of {gpu.label} unknown")
        return
    slowdowns: list[timing.Slowdown] = []
    if ackpt:
        slowdowns.append(timing.recompute_slowdown())
    if ft.method == "qlora":
        slowdowns.append(timing.qlora_slowdown())
    tokens_per_step = ft.micro_batch * ft.seq_len * ft.grad_accum
    step_s = timing.step_compute_seconds(ft.shape.params, tokens_per_step, tflops, timing.combined(slowdowns))
    trainable = ft.trainable_params
    host_bytes = 0.0
    if family == "zero3_cpu_offload":
        host_bytes = K.OFFLOAD_HOST_BYTES_PER_PARAM * trainable / workers
        on_host = gpus_on_busiest_host(workers, res)
        cpu = timing.cpu_optimizer_slowdown(trainable * on_host / workers, step_s)
        slowdowns.append(cpu)
        step_s *= cpu.factor
    if workers > 1:
        shard = workers if family in SHARDED_FAMILIES else 1
        traffic = StepTraffic(
            family=family,
            workers=workers,
            interconnect=res.interconnect,
            grad_bytes=trainable * K.GRAD_BYTES[ft.precision],
            param_bytes=weights_gb * K.GIB * shard,
            micro_batches=ft.grad_accum,
            layers=ft.shape.layers,
            host_bytes=host_bytes,
        )
        comm = step_communication(traffic)
        efficiency = scaling_efficiency(step_s, comm)
        apply_efficiency(
            c,
            efficiency,
            f"{comm.seconds:.2f} s communication per step ({comm.description}), "
            f"{comm.exposed_seconds:.2f} s exposed vs {step_s:.1f} s compute",
        )
    else:
        efficiency = 1.0
        c.efficiency = 1.0
    if ft.train_tokens is None:
        c.reasons.append("no time estimate: workload.train_tokens_m not set")
        return
    minutes, time_text = timing.finetune_minutes(
        ft.shape.params, ft.train_tokens, workers, tflops, slowdowns, efficiency
    )
    c.set_time(minutes, time_text)
    if res.hourly_cost_usd_per_gpu is not None:
        c.set_cost(*timing.cost_usd(minutes, workers, res.hourly_cost_usd_per_gpu))
