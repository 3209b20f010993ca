"""``checkpoint`` and ``log_metrics``: the two calls inside a training loop.

Rank 0 writes ``step-<step:06d>/`` parts through ``open_part`` (hashed while written)
and commits them with a manifest written last, on the training thread or, with
``async_save``, from a host copy on a background thread (``_async_save``); every rank then
meets at a barrier. Metrics go to one JSONL file.
"""

from __future__ import annotations

import json
import numbers
import time
from typing import Any

from flashruntime.errors import InvalidProfileRequest
from flashruntime.torch import (
    _async_save,
    _auto,
    _compute_time,
    _heartbeat,
    _preempt,
    _profile,
    _rng,
    _sharded,
    _state,
    _step,
)


def checkpoint_due(step: int, every: int | None) -> bool:
    """Pure gate: ``every=None`` is unconditional; else skip ``every <= 0``, step 0 and
    steps that are not a multiple of ``every``."""
    if every is None:
        return True
    return every > 0 and step != 0 and step % every == 0


def _resume_state() -> list[dict[str, Any]] | None:
    """Every rank's generator states, gathered on rank 0 (None on the others); collective."""
    mine = {"rank": _state.rank(), "rng": _rng.capture()}
    if _state.world_size() > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            gathered: list[Any] | None = [None] * dist.get_world_size() if _state.is_main() else None
            dist.gather_object(mine, gathered, dst=0)
            return gathered
    return [mine]


@_compute_time.boundary
def checkpoint(model: Any, optimizer: Any = None, *, step: int, every: int | str | None = None,
               mtbf_s: float | None = None, async_save: bool = False) -> None:
    """Save ``model`` (and ``optimizer``) as checkpoint ``step`` when the gate allows.

    ``every`` is None (save now), a step count (save at its multiples), or ``"auto"``: the
    Young/Daly interval ``sqrt(2 x C x MTBF)`` from the measured save cost C and ``mtbf_s``
    (else ``$FLASHML_CHECKPOINT_MTBF_S``, else 86400 s), in steps of the measured step time;
    the first save is at the second step seen, to measure C (see ``checkpoint_cadence``).
    Always refreshes the heartbeat with ``step``. Besides the model and optimizer, the
    checkpoint holds every rank's random generator states (Python, NumPy, torch CPU and CUDA)
    and the position of the loader ``prepare`` returned, so a resumed run continues exactly.
    Rank 0 writes; with several ranks everyone first hands rank 0 its generator states and
    then waits at a barrier, so the call is collective: every rank makes it.
After a preemption notice (see ``flashruntime.torch._preempt``) every rank saves this
    step, whatever the gate says, and the process then exits 0.

    With ``async_save=True`` rank 0 copies the state into host memory and returns; a
    background thread writes and commits the step (``wait_for_checkpoint`` waits for it). At
    most one save is in flight: a save first waits for the previous one, so when any rank
    leaves the barrier of save N, save N-1 is committed. A background save that failed
    raises ``CheckpointError`` from rank 0's next ``checkpoint`` call (or from
    ``wait_for_checkpoint``); the checkpoint before it stays the newest valid one. C, for
    ``every="auto"``, is the time the call held rank 0, in either mode. A preemption's save is
    written before the call returns, whatever ``async_save`` says: the process leaves after it.
    """
    auto = every == "auto"
    if not auto and every is not None and (isinstance(every, bool) or not isinstance(every, int)):
        raise InvalidProfileRequest(f"every must be None, a number of steps or 'auto', got {every!r}")
    if not isinstance(async_save, bool):
        raise InvalidProfileRequest(f"async_save must be True or False, got {async_save!r}")
    failure_s = _auto.mtbf(mtbf_s) if auto else None
    due = _auto.due(step) if auto else checkpoint_due(step, every)  # type: ignore[arg-type]
    preempted = _preempt.agreed()  # collective under flashruntime with several ranks: all save this step or none
    due = due or preempted
    _heartbeat.beat(step, force=due)  # a written checkpoint is news worth a heartbeat
    saver = _async_save.SAVER
    _sharded.SHARDED.raise_failure()  # every rank writes its shards of a sharded save, so any may have failed
    if _state.is_main():
        saver.raise_failure()  # a background save that failed since the last call
    if not due:
        return
    sharded = _sharded.is_sharded(model)
    save_s = None
    started = time.perf_counter()
    if _state.is_main() and not sharded:
        saver.wait()  # at most one save in flight, in either mode
        saver.raise_failure()
    ranks = _resume_state()  # every rank's, before rank 0 writes: a collective like the barrier below
    if sharded:  # every rank writes its shards through DCP; rank 0 commits
        _sharded.save(_step.Destination.of(step), model, optimizer,
                      _step.resume_state(ranks) if ranks is not None else None, background=async_save and not preempted)
        save_s = time.perf_counter() - started
    elif _state.is_main():
        destination = _step.Destination.of(step)
        if async_save and not preempted:
            saver.submit(destination, _step.capture_parts(model, optimizer, ranks, to_cpu=False))
        else:
            _step.write_parts(destination, _step.capture_parts(model, optimizer, ranks))
        save_s = time.perf_counter() - started
    if _state.world_size() > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    if failure_s is not None:
        _auto.saved(step, save_s, failure_s)
    if preempted:
        _preempt.leave(step)


def wait_for_checkpoint(timeout: float | None = None) -> bool:
    """Block until the background save of ``checkpoint(..., async_save=True)`` is committed.

    True when no save is in flight any more, False when ``timeout`` seconds passed first; a
    background save that failed raises ``CheckpointError``. Only rank 0 writes, so on the
    other ranks it returns True at once. Not collective. A pending save is also finished at
    interpreter exit.
    """
    finished = _async_save.SAVER.wait(timeout) and _sharded.SHARDED.wait(timeout)
    if finished:
        _async_save.SAVER.raise_failure()
        _sharded.SHARDED.raise_failure()
    return finished


def checkpoint_cadence() -> _auto.Cadence | None:
    """The ``every="auto"`` interval in force (save cost, step time, MTBF, interval in seconds
    and in steps), None before the first auto save."""
    return _auto.AUTO.cadence


def _jsonable(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    return str(value)


def _profile_step(step: int, metrics: dict[str, Any]) -> None:
    # Outside the never-raises guard of log_metrics: a profiled process ends here on purpose.
    _profile.on_step(step, metrics)


@_compute_time.boundary
def log_metrics(metrics: dict[str, Any]) -> None:
    """Heartbeat with ``metrics["step"]`` when it is an integer; rank 0 appends the
    metrics as one JSON line to ``<output dir>/metrics.jsonl``, with ``ts`` (seconds since
    the epoch) added unless given. Never raises. Under the profiler, the step is timed and
    the process ends after the profile's last measured step."""
    profiled_step: int | None = None
    try:
        step = metrics.get("step") if isinstance(metrics, dict) else None
        integral = isinstance(step, numbers.Integral) and not isinstance(step, bool)
        _heartbeat.beat(int(step) if integral else None)
        if integral:
            profiled_step = int(step)
        if not _state.is_main():
            return
        if "ts" not in metrics:  # when the step ended: the goodput ledger times steps by it
            metrics = {**metrics, "ts": time.time()}
        line = json.dumps(metrics, default=_jsonable, allow_nan=True)
        directory = _state.output_dir()
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except Exception:
        pass
    finally:  # every rank, rank 0 after its line is written
        if profiled_step is not None:
            _profile_step(profiled_step, metrics)
