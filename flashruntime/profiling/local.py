"""``LocalProfiler``: run the user's command (plain or torchrun) on this machine through the
local launcher, in a temporary output and checkpoint directory of its own, for warm-up plus
measured steps, and read what the torch helper's profile mode wrote. Nothing is written
where the real job keeps its output or checkpoints, and the directory is removed afterwards.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shlex
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashruntime.errors import InvalidProfileRequest, LaunchError, ProfileError
from flashruntime.profiling.api import Profiler
from flashruntime.protocol.profile_v1alpha1 import ProfileResult

if TYPE_CHECKING:
    from flashruntime.protocol.plan_v1alpha1 import PlanRequest, StrategyPlan

__all__ = ["LocalProfiler", "summarise"]

ENV_WARMUP = "FLASHML_PROFILE_WARMUP_STEPS"  # read by flashruntime.torch's profile mode
ENV_MEASURED = "FLASHML_PROFILE_MEASURED_STEPS"
POLL_S = 0.2
LOG_TAIL_LINES = 20


def _positive_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidProfileRequest(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class LocalProfiler(Profiler):
    """Profile ``command`` (a string or argv list, e.g. ``"torchrun --nproc-per-node 2 train.py"``)
    that uses ``flashruntime.torch`` (``ft.prepare`` and ``ft.log_metrics({"step": ...})`` each
    step). ``warmup_steps`` are run and discarded, ``measured_steps`` are timed; ``workdir`` is
    where the command runs (default: the current directory); ``env`` is added to its environment.
    ``clock`` (monotonic seconds) bounds the wall clock; tests may pass a fake one."""

    def __init__(
        self,
        command: str | list[str],
        *,
        warmup_steps: int = 3,
        measured_steps: int = 10,
        workdir: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv or not all(isinstance(part, str) for part in argv):
            raise InvalidProfileRequest(
                f"command must be a non-empty string or list of strings, e.g. 'python train.py'; got {command!r}"
            )
        self.argv = argv
        self.warmup_steps = _positive_int("warmup_steps", warmup_steps, 0)
        self.measured_steps = _positive_int("measured_steps", measured_steps, 1)
        self.workdir = None if workdir is None else str(workdir)
        self.env = dict(env or {})
        self.clock = clock

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def profile(
        self, request: PlanRequest | None = None, plan: StrategyPlan | None = None, budget_seconds: float = 300.0
    ) -> ProfileResult:
        """Run the command until warm-up + measured steps are done or ``budget_seconds`` pass.

        Raises ``InvalidProfileRequest`` for a budget that is not a positive finite number,
        ``ProfileError`` when the command is cut at the budget, exits with an error, or ends
        before its steps were measured (each with the log's tail)."""
        if (isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float))
                or not math.isfinite(budget_seconds) or budget_seconds <= 0):
            raise InvalidProfileRequest(
                f"budget_seconds must be a positive finite number of seconds, got {budget_seconds!r}; "
                "the default is 300"
            )
        from flashruntime.launchers.local import LocalProcessLauncher
        from flashruntime.strategies.command import compile_workload
        from flashruntime.workloads.command import CommandWorkload, Source

        workload = CommandWorkload(command=self.argv, source=Source(path=self.workdir or "."), env=self.env)
        spec = compile_workload(workload, None)
        spec = spec.model_copy(update={"env": {**spec.env, ENV_WARMUP: str(self.warmup_steps),
                                               ENV_MEASURED: str(self.measured_steps)}})
        scratch = Path(tempfile.mkdtemp(prefix="flashruntime-profile-"))
        try:
            launcher = LocalProcessLauncher(scratch, checkpoint_dir=scratch / "ckpt", term_grace_s=2.0)
            try:
                handle = launcher.launch(spec, "profile", "attempt")
            except LaunchError as exc:
                raise ProfileError(f"profile of {self.command!r} could not start: {exc}") from exc
            deadline = self.clock() + float(budget_seconds)
            state = handle.poll()
            while not state.terminal and self.clock() < deadline:
                state = handle.wait(POLL_S)
            attempt = launcher.attempt_dir("profile", "attempt")
            if not state.terminal:
                handle.cancel(grace_s=2.0)
                reached = _last_step(attempt)
                raise ProfileError(
                    f"profile of {self.command!r} was cut at its budget of {budget_seconds:g} s after "
                    f"{'no step' if reached is None else f'step {reached}'} of "
                    f"{self.warmup_steps} warm-up + {self.measured_steps} measured; raise budget_seconds, lower "
                    f"measured_steps, or make sure the script calls ft.log_metrics({{'step': n}}) every step"
                    f"{_tail(handle)}"
                )
            ranks = sorted(attempt.rglob("profile-rank-*.json"))
            if handle.exit_code != 0 or not ranks:
                what = (f"exited with code {handle.exit_code}" if handle.exit_code != 0
                        else "ended before its measured steps were done")
                raise ProfileError(
                    f"profile of {self.command!r} {what}; it needs {self.warmup_steps} warm-up + "
                    f"{self.measured_steps} measured steps, each reported with ft.log_metrics({{'step': n}}) after "
                    f"ft.prepare(...){_tail(handle)}"
                )
            records = [json.loads(path.read_text(encoding="utf-8")) for path in ranks]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # The ranks say how many there were: torchrun may be named by a path or run as a module.
        world = max(int(record.get("world_size", 1)) for record in records)
        on_cpu = all(str(record.get("device", "cpu")).split(":")[0] == "cpu" for record in records)
        return summarise(records, strategy_family=_family(plan, world, on_cpu), workers=world)


def _family(plan: StrategyPlan | None, world_size: int, on_cpu: bool) -> str:
    """The candidate a run measured: the plan's when it has this many workers on this device class,
    else one process or DDP on the device the ranks ran on."""
    cpu_plan = plan is not None and plan.gpus_per_worker == 0
    if plan is not None and plan.workers == world_size and cpu_plan == on_cpu:
        return plan.strategy_family
    if on_cpu:
        return "cpu" if world_size == 1 else "cpu_ddp"
    return "single_gpu" if world_size == 1 else "ddp"


def _tail(handle: Any) -> str:
    text = handle.logs(LOG_TAIL_LINES).strip()
    return f"\n--- last lines of its log ---\n{text}" if text else ""


def _last_step(attempt: Path) -> int | None:
    metrics = attempt / "metrics.jsonl"
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def summarise(records: list[dict[str, Any]], *, strategy_family: str | None = None,
              workers: int | None = None) -> ProfileResult:
    """One ``ProfileResult`` from every rank's profile record: the slowest rank's median step
    sets the step time, memory is the largest rank's peak, the checkpoint is rank 0's."""
    step_times, waits, tokens_rates = [], [], []
    for record in records:
        marks = record["marks"]
        warmup = record["warmup"]
        measured = marks[warmup:]
        durations = [b[1] - a[1] for a, b in itertools.pairwise(measured)]
        if not durations:
            continue
        step_times.append(statistics.median(durations))
        wall = measured[-1][1] - measured[0][1]
        if wall > 0:
            waits.append(min(1.0, max(0.0, (measured[-1][2] - measured[0][2]) / wall)))
            tokens = [m[3] for m in measured[1:] if m[3] is not None]
            if len(tokens) == len(durations):
                tokens_rates.append(sum(tokens) / wall)
    if not step_times:
        raise ProfileError("the profile recorded no measured step: every rank ended at its first logged step")
    main = next((r for r in records if r.get("rank") == 0), records[0])
    vram = [r["peak_vram_gb"] for r in records if r.get("peak_vram_gb") is not None]
    notes = [f"device {main.get('device', 'cpu')}" + (f" ({main['gpu_name']})" if main.get("gpu_name") else ""),
             f"{len(records)} rank(s); step time is the slowest rank's median of {main['measured']} steps"]
    if not vram:
        notes.append("no CUDA device: peak_vram_gb not measured, host_ram_gb is the peak RSS of a rank")
    if "checkpoint_save_s" not in main:
        notes.append("no checkpoint measured: the script does not pass its model to ft.prepare")
    return ProfileResult(
        basis="profiled",
        peak_vram_gb=max(vram) if vram else None,
        host_ram_gb=max(r["host_ram_gb"] for r in records),
        step_time_s=max(step_times),
        tokens_per_s=min(tokens_rates) if tokens_rates else None,
        dataloader_wait_fraction=max(waits) if waits else None,
        checkpoint_save_s=main.get("checkpoint_save_s"),
        checkpoint_restore_s=main.get("checkpoint_restore_s"),
        checkpoint_size_gb=main.get("checkpoint_size_gb"),
        measured_steps=main["measured"],
        warmup_steps=main["warmup"],
        notes=notes,
        strategy_family=strategy_family,
        workers=workers,
        device=main.get("device"),
    )
