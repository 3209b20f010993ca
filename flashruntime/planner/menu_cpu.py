"""Candidate menu of the ``cpu`` device class: PyTorch training with ``resources.gpus = 0``.
``cpu`` is one process; ``cpu_ddp_x<W>`` is W gloo processes on one host under torchrun, W
up to the host's cores (at most 8; 2 when ``cpu_cores`` is not given). Each is judged on host
RAM. The planner has no CPU throughput model, so only a measurement gives a time.
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate, Knobs
from flashruntime.planner.checks import apply_host_ram
from flashruntime.planner.libraries import cpu_libraries
from flashruntime.planner.memory import GenericTraining, pytorch_memory
from flashruntime.planner.topology import world_sizes
from flashruntime.protocol.plan_v1alpha1 import PyTorchTraining, Resources

__all__ = ["NO_CPU_TIME", "NO_CPU_TIME_NOTE", "cpu_candidates", "cpu_workers"]

# Why a CPU candidate has no time, and the report's note when no candidate was measured.
NO_CPU_TIME = (
    "the planner has no CPU throughput model; profile a few steps (--profile CMD --steps N) for a measured time"
)
NO_CPU_TIME_NOTE = f"no time estimate for CPU: {NO_CPU_TIME}"


def cpu_workers(res: Resources) -> int:
    """The widest gloo world on one host: ``cpu_cores`` capped at 8 when given, else 2."""
    if "cpu_cores" not in res.model_fields_set:
        return K.CPU_DDP_DEFAULT_WORKERS
    return max(1, min(res.cpu_cores, K.CPU_DDP_MAX_WORKERS))


def cpu_candidates(wl: PyTorchTraining, res: Resources, warnings: list[str]) -> list[Candidate]:
    """``cpu`` and ``cpu_ddp_x<W>`` for W in the powers of two below the widest world and that world."""
    widest = cpu_workers(res)
    _notes(wl, res, widest, warnings)
    activation_gb = wl.activation_gb_per_gpu
    if activation_gb is None:
        activation_gb = K.DEFAULT_PYTORCH_ACTIVATION_GB
        warnings.append(f"activation_gb_per_gpu not set: {activation_gb:g} GB per process assumed - profile a few "
                        "steps for the measured peak")
    job = GenericTraining(
        params=wl.parameters_m * 1e6,
        trainable_fraction=wl.trainable_fraction,
        precision=wl.precision,
        optimizer=wl.optimizer,
        activation_gb=activation_gb,
    )
    return [_evaluate(job, workers, res) for workers in world_sizes(widest)]


def _notes(wl: PyTorchTraining, res: Resources, widest: int, warnings: list[str]) -> None:
    if res.gpu_type is not None or res.vram_gb is not None:
        warnings.append("resources.gpus = 0: planned on the CPU, resources.gpu_type and vram_gb are not used")
    if "cpu_cores" not in res.model_fields_set:
        warnings.append(f"resources.cpu_cores not set: CPU data parallel planned on at most {widest} processes; "
                        "give the host's core count for wider plans")
    elif res.cpu_cores > widest:
        warnings.append(f"CPU data parallel capped at {widest} processes on one host "
                        f"(resources.cpu_cores = {res.cpu_cores})")
    if res.hosts > 1:
        warnings.append(f"CPU plans run on one host: resources.hosts = {res.hosts} is not used")
    if wl.est_train_gpu_hours is not None:
        warnings.append("est_train_gpu_hours is a GPU figure: CPU plans do not use it")
    if res.hourly_cost_usd_per_gpu is not None:
        warnings.append("hourly_cost_usd_per_gpu prices GPUs: CPU plans have no cost estimate")


def _evaluate(job: GenericTraining, workers: int, res: Resources) -> Candidate:
    family = "cpu" if workers == 1 else "cpu_ddp"
    c = Candidate(
        name=family if workers == 1 else f"{family}_x{workers}",
        family=family,
        workers=workers,
        launcher="local_process" if workers == 1 else "torchrun",
        workload_mode="local" if workers == 1 else "coordinated_training",
        gpus_per_worker=0,
        colocated=True,
        knobs=Knobs(precision=job.precision),
        libraries=cpu_libraries(family),
    )
    # The same tensors a GPU rank holds (a DDP rank adds its gradient buckets), in host RAM, without
    # the CUDA context; a process's own start-up memory is left to a profile to measure.
    mem = pytorch_memory(job, "single_gpu" if workers == 1 else "ddp", workers)
    parts = (f"weights {mem.weights_gb:.1f} + gradients {mem.gradients_gb:.1f} + optimizer {mem.optimizer_gb:.1f} + "
             f"activations {mem.activations_gb:.1f} + transient {mem.transient_gb:.1f} GB")
    apply_host_ram(c, mem.tensors_gb * workers, res.cpu_ram_gb,
                   f"host RAM {workers} process(es) x {mem.tensors_gb:.1f} GB of tensors ({parts}) =")
    c.no_time(NO_CPU_TIME)
    return c
