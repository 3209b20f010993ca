"""The libraries a plan names, each with its role: launcher, distribution,
peft, quantization, optimizer, checkpointing, activation checkpointing, coordination.

Entries are (name, role, purpose) tuples; minting turns them into ``LibraryRef``.
"""

from __future__ import annotations

from flashruntime.planner.candidate import Knobs

Library = tuple[str, str, str]

TORCHRUN: Library = ("torchrun", "launcher", "starts one process per GPU with the rendezvous environment")
LOCAL_PROCESS: Library = ("flashruntime", "launcher", "runs the command as one supervised local process")
LEASES: Library = ("flashruntime.leases", "launcher", "hands tasks to workers under renewable leases")
DCP: Library = ("torch.distributed.checkpoint", "checkpointing", "sharded, resumable checkpoints")
FT_CHECKPOINT: Library = ("flashruntime.torch", "checkpointing", "ft.checkpoint: verified checkpoints and resume")

CPU_TORCHRUN: Library = ("torchrun", "launcher", "starts one CPU process per rank with the rendezvous environment")
GLOO_DDP: Library = ("torch.nn.parallel.DistributedDataParallel", "distribution",
                     "replicated model, gradient all-reduce over gloo")

_DISTRIBUTION: dict[str, Library] = {
    "ddp": ("torch.nn.parallel.DistributedDataParallel", "distribution", "replicated model, gradient all-reduce"),
    "fsdp2": ("torch.distributed.fsdp.fully_shard", "distribution", "FSDP2: parameters, gradients, states sharded"),
    "zero3_cpu_offload": ("deepspeed", "distribution", "ZeRO-3 with optimizer states offloaded to host RAM"),
}


def training_libraries(family: str, knobs: Knobs, optimizer: str) -> tuple[Library, ...]:
    """Libraries of a PyTorch training candidate (single GPU or distributed)."""
    libs: list[Library] = [TORCHRUN]
    if family in _DISTRIBUTION:
        libs.append(_DISTRIBUTION[family])
    if knobs.peft:
        libs.append(("peft", "peft", f"{knobs.peft} adapters on all linear projections"))
    if knobs.quantization:
        libs.append(("bitsandbytes", "quantization", f"{knobs.quantization} 4-bit frozen base weights"))
    if optimizer == "adamw_8bit":
        libs.append(("bitsandbytes", "optimizer", "8-bit AdamW states"))
    if knobs.activation_checkpointing:
        libs.append(("torch.utils.checkpoint", "activation_checkpointing", "recompute layer activations in backward"))
    libs.append(DCP if family != "single_gpu" else FT_CHECKPOINT)
    return tuple(libs)


def cpu_libraries(family: str) -> tuple[Library, ...]:
    """Libraries of a CPU training candidate: one supervised process, or gloo DDP under torchrun."""
    if family == "cpu":
        return (LOCAL_PROCESS, FT_CHECKPOINT)
    return (CPU_TORCHRUN, GLOO_DDP, DCP)
