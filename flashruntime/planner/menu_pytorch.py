"""Candidate menu for ``pytorch_training``: ``single_gpu``, ``ddp_x<W>`` and
``fsdp2_x<W>`` for a model known only by its parameter count. Activations default to
2.0 GB/GPU; time comes only from ``est_train_gpu_hours``. A request without GPUs is planned by
the CPU menu (``menu_cpu``).
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import NO_TIME_NOTE, Candidate, Knobs
from flashruntime.planner.catalog_gpus import GpuFacts
from flashruntime.planner.checks import apply_memory_band, apply_objective
from flashruntime.planner.libraries import training_libraries
from flashruntime.planner.memory import GenericTraining, pytorch_memory
from flashruntime.planner.topology import fits_one_host, same_host_link_warning, world_sizes
from flashruntime.planner.unplannable import UnplannableRequest
from flashruntime.protocol.plan_v1alpha1 import Objective, PyTorchTraining, Resources


def pytorch_candidates(
    wl: PyTorchTraining, res: Resources, obj: Objective, gpu: GpuFacts | None, warnings: list[str]
) -> list[Candidate]:
    if gpu is None:
        raise UnplannableRequest(
            f"PyTorch training of {wl.model!r} needs the GPU's memory: set resources.gpu_type (a catalog GPU) "
            f"or resources.vram_gb"
        )
    link_note = same_host_link_warning(res)
    if link_note:
        warnings.append(link_note)
    activation_gb = wl.activation_gb_per_gpu
    if activation_gb is None:
        activation_gb = K.DEFAULT_PYTORCH_ACTIVATION_GB
        warnings.append(
            f"activation_gb_per_gpu not set: {activation_gb:g} GB/GPU assumed - measure one step for accuracy"
        )
    if wl.est_train_gpu_hours is None:
        warnings.append(f"est_train_gpu_hours not set: {NO_TIME_NOTE}")
    job = GenericTraining(
        params=wl.parameters_m * 1e6,
        trainable_fraction=wl.trainable_fraction,
        precision=wl.precision,
        optimizer=wl.optimizer,
        activation_gb=activation_gb,
    )
    out: list[Candidate] = []
    for workers in world_sizes(res.gpus):
        for family in ["single_gpu"] if workers == 1 else ["ddp", "fsdp2"]:
            out.append(_evaluate(job, wl, family, workers, res, obj, gpu))
    return out


def _evaluate(
    job: GenericTraining,
    wl: PyTorchTraining,
    family: str,
    workers: int,
    res: Resources,
    obj: Objective,
    gpu: GpuFacts,
) -> Candidate:
    knobs = Knobs(precision=job.precision)
    c = Candidate(
        name=family if workers == 1 else f"{family}_x{workers}",
        family=family,
        workers=workers,
        launcher="torchrun",
        workload_mode="local" if family == "single_gpu" else "coordinated_training",
        gpus_per_worker=1,
        colocated=fits_one_host(workers, res),
        knobs=knobs,
        libraries=training_libraries(family, knobs, job.optimizer),
    )
    apply_memory_band(c, pytorch_memory(job, family, workers), gpu.vram_gb)
    if workers > 1:
        c.reasons.append("scaling not modelled: generic PyTorch gives no per-step compute, linear scaling assumed")
    if wl.est_train_gpu_hours is None:
        c.no_time("est_train_gpu_hours not set")
    else:
        minutes, text, exact = timing.gpu_hours_minutes(wl.est_train_gpu_hours, workers, None)
        c.set_time(minutes, text, exact)
        if res.hourly_cost_usd_per_gpu is not None:
            c.set_cost(*timing.cost_usd(minutes, workers, res.hourly_cost_usd_per_gpu, exact))
    if c.feasible:
        apply_objective(c, obj)
    return c
