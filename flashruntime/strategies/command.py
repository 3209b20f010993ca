"""Compile a ``CommandWorkload`` into a ``LaunchSpec`` (pure)."""

from __future__ import annotations

from typing import Any

from flashruntime.strategies import LaunchSpec
from flashruntime.workloads.command import CommandWorkload

__all__ = ["compile_workload", "torchrun_options"]

_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")
# torchrun's options that take no value; every other option takes one (as --opt=V or --opt V).
_TORCHRUN_SWITCHES = frozenset({
    "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank",
})


def torchrun_options(argv: list[str]) -> dict[str, str | None]:
    """torchrun's own options in ``argv`` (``argv[0]`` is torchrun): name -> value (None for
    a switch). Tokens after the script (or the ``-m`` module) are the script's arguments,
    whatever they are called, and are not read."""
    options: dict[str, str | None] = {}
    index = 1
    while index < len(argv):
        token = argv[index]
        if token == "--" or not token.startswith("-"):
            break  # the script (or module): torchrun's options end here
        name, has_value, value = token.partition("=")
        if has_value:
            options[name] = value
            index += 1
        elif name in _TORCHRUN_SWITCHES:
            options[name] = None
            index += 1
        else:
            options[name] = argv[index + 1] if index + 1 < len(argv) else None
            index += 2
    return options


def _torchrun_nproc(argv: list[str]) -> str | None:
    """The per-node count from torchrun's own options."""
    options = torchrun_options(argv)
    return next((options[flag] for flag in _NPROC_FLAGS if flag in options), None)


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
