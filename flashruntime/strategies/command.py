"""Compile a ``CommandWorkload`` into a ``LaunchSpec`` (pure)."""

from __future__ import annotations

from typing import Any

from flashruntime.strategies import LaunchSpec
from flashruntime.workloads.command import CommandWorkload

__all__ = ["compile_workload"]

_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def _torchrun_nproc(argv: list[str]) -> str | None:
    for index, token in enumerate(argv[1:], start=1):
        for flag in _NPROC_FLAGS:
            if token == flag and index + 1 < len(argv):
                return argv[index + 1]
            if token.startswith(flag + "="):
                return token.split("=", 1)[1]
    return None


def compile_workload(workload: CommandWorkload, params: dict[str, Any] | None = None) -> LaunchSpec:
    argv = workload.argv(params)
    env = {k: (v.format(**params) if params is not None else v) for k, v in workload.env.items()}
    notes = [f"mode={workload.resolved_mode()}"]
    world_size = 1
    if argv and argv[0] == "torchrun":
        # With --nnodes=M the per-node count is what we know; the rendezvous decides the global size.
        raw = _torchrun_nproc(argv)
        if raw is not None:
            try:
                world_size = int(raw)
            except ValueError:
                notes.append(f"world size unresolved: --nproc-per-node={raw} is not an integer")
            else:
                if world_size < 1:
                    notes.append(f"world size unresolved: --nproc-per-node={raw} is below 1")
                    world_size = 1
    return LaunchSpec(argv=argv, env=env, world_size=world_size, workdir_hint=workload.source.path, notes=notes)
