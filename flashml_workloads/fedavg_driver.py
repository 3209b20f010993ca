"""FedAvg driver: one lease job per round, quorum, bounded-influence reduce, published weights.

Each round submits a ``federated_averaging`` job, polls the coordinator until a quorum of
shards has committed, freezes that set, downloads the deltas, reduces them with
``reduce_deltas_with_report`` and PUTs the new weights as ``jobs/<job>/round-<r:03d>/weights.json``,
whose ``artifact://`` URI feeds the next round. ``resume_state`` picks a killed run up again.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, TypeVar

from flashml_workloads._fedavg_http import Coordinator, HttpCoordinator, artifact_json
from flashml_workloads.fedavg_weights import apply_delta, decode, encode, reduce_deltas_with_report, require_finite
from flashruntime.client import RetryPolicy, is_transient
from flashruntime.errors import ArtifactNotFound, CoordinatorUnavailable, QuorumNotMet
from flashruntime.protocol.lease_rules import FEDAVG_LEASE_SECONDS

__all__ = [
    "ArtifactNotFound",
    "BuildRound",
    "Coordinator",
    "CoordinatorUnavailable",
    "DEFAULT_IMAGE",
    "HttpCoordinator",
    "QuorumNotMet",
    "RoundPlan",
    "RoundResult",
    "resume_state",
    "run_fedavg",
]

DEFAULT_IMAGE = "local/tier1:dev"
_DELTA_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BACKOFF_CAP_S = 5.0
_T = TypeVar("_T")


class RoundResult(TypedDict):
    round: int
    participants: int
    mean_loss: float
    job_id: str
    clipped: list[dict[str, Any]]


class RoundPlan(TypedDict):
    body: dict[str, Any]
    task_ids: list[str]


BuildRound = Callable[[int, "str | None"], RoundPlan]


def _round_body(
    round_idx: int,
    num_shards: int,
    worker_params: dict[str, Any],
    weights_uri: str | None,
    lease_seconds: float,
    image: str,
    isolation_tier: str,
    allow_fallback: bool,
    pool: str | None = None,
    backend: str = "leases",
) -> dict[str, Any]:
    """The JobSpec of one round. ``pool`` None or ``"any"`` leaves ``placement`` absent."""
    repository, sep, tag = image.rpartition(":")
    if not sep or not repository or not tag:
        raise ValueError(f"image must be 'repository:tag' with a pinned tag, got {image!r}")
    parameters = dict(worker_params)
    parameters.update({"round": round_idx, "num_shards": num_shards, "lease_seconds": lease_seconds})
    if weights_uri is not None:
        parameters["weights"] = weights_uri
    spec: dict[str, Any] = {
        "execution": {"backend": backend},
        "image": {"repository": repository, "tag": tag},
        "isolation": {"tier": isolation_tier, "allowFallback": allow_fallback},
    }
    # a stamped "any" would read as an ordinary pool id at placement and strand every task
    if pool is not None and pool != "any":
        spec["placement"] = {"pool": pool}
    spec["workload"] = {"type": "federated_averaging", "parameters": parameters}
    return {
        "apiVersion": "flashml.dev/v1alpha1",
        "kind": "Job",
        "metadata": {"name": f"fedavg-r{round_idx:03d}"},
        "spec": spec,
    }


class _Caller:
    """Retries coordinator calls by the client's rule (``RetryPolicy``: exponential backoff
    capped at 5 s), and never waits past a deadline."""

    def __init__(self, attempts: int, backoff_s: float, clock: Callable[[], float], sleep: Callable[[float], None]):
        self.policy = RetryPolicy(attempts=attempts, backoff_s=backoff_s, max_backoff_s=_BACKOFF_CAP_S, sleep=sleep)
        self.clock = clock
        self.sleep = sleep

    def __call__(self, what: str, fn: Callable[[], _T], deadline: float | None = None) -> _T:
        attempts = self.policy.attempts
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt == attempts:
                    raise CoordinatorUnavailable(
                        f"{what} failed {attempts} time(s) with connection errors or HTTP 5xx; "
                        f"last error: {exc}. Check that the coordinator is up, or raise poll_attempts"
                    ) from exc
                wait = self.policy.delay(attempt, exc)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - self.clock()))
            self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


def _plan(
    r: int,
    weights_uri: str | None,
    build_round: BuildRound | None,
    min_participants: int,
    default: Callable[[int, str | None], dict[str, Any]],
    num_shards: int,
) -> RoundPlan:
    if build_round is None:
        return {"body": default(r, weights_uri), "task_ids": [f"shard-{i:03d}" for i in range(num_shards)]}
    plan = build_round(r, weights_uri)
    task_ids = list(plan["task_ids"])
    if len(set(task_ids)) != len(task_ids):
        raise ValueError(
            f"build_round({r}) returned duplicate task ids {task_ids}: a repeated id collides with another task's "
            "commits; each task id must be unique"
        )
    if len(task_ids) < min_participants:
        raise ValueError(
            f"build_round({r}) returned {len(task_ids)} task id(s), fewer than min_participants "
            f"({min_participants}); the round could never reach quorum"
        )
    return {"body": plan["body"], "task_ids": task_ids}


def _wait_for_quorum(
    coord: Coordinator,
    job_id: str,
    r: int,
    task_ids: list[str],
    min_participants: int,
    round_timeout_s: float,
    poll_seconds: float,
    call: _Caller,
) -> list[str]:
    """Poll until ``min_participants`` tasks have committed; the frozen set in task-id order."""
    deadline = call.clock() + round_timeout_s
    tasks_fn = getattr(coord, "tasks", None)
    commit_keys = {f"jobs/{job_id}/{t}/metrics.json": t for t in task_ids}
    while True:
        state = str(call(f"job_state({job_id})", lambda: coord.job_state(job_id), deadline))
        listed = call(f"artifacts({job_id})", lambda: coord.artifacts(job_id), deadline)
        committed = {commit_keys[a["key"]] for a in listed if isinstance(a, dict) and a.get("key") in commit_keys}
        if callable(tasks_fn):
            rows = call(f"tasks({job_id})", lambda: tasks_fn(job_id), deadline)
            completed = {
                row.get("task_id") for row in rows if isinstance(row, dict) and row.get("state") == "COMPLETED"
            }
            committed &= completed
        if len(committed) >= min_participants:
            return sorted(committed)  # frozen: later commits are ignored for this round
        if state in ("FAILED", "CANCELLED"):
            raise QuorumNotMet(
                f"round {r} (job {job_id}) is {state} with {len(committed)} of {min_participants} required "
                f"shard commits; see the job's events for the failed tasks"
            )
        remaining = deadline - call.clock()
        if remaining <= 0:
            raise QuorumNotMet(
                f"round {r} (job {job_id}) timed out after {round_timeout_s} s with {len(committed)} of "
                f"{min_participants} required shard commits; raise round_timeout_s or lower min_participants"
            )
        call.sleep(min(poll_seconds, remaining))


def _contribution(coord: Coordinator, job_id: str, task: str, call: _Caller) -> tuple[Any, Any, float]:
    """``(delta blob, samples, loss)`` of one committed task."""
    prefix = f"jobs/{job_id}/{task}/"
    metrics_key = prefix + "metrics.json"
    raw = call(f"get_artifact({metrics_key})", lambda: coord.get_artifact(metrics_key))
    metrics = artifact_json(raw, metrics_key)
    if not isinstance(metrics, dict):
        raise ValueError(f"{prefix}metrics.json must be a JSON object, got {type(metrics).__name__}")
    delta_file = metrics.get("delta_file", "delta.json")
    # fullmatch: with re.match, ``$`` also matches before a trailing newline ("delta.json\n")
    if not isinstance(delta_file, str) or not _DELTA_FILE.fullmatch(delta_file):
        raise ValueError(
            f"task {task}: delta_file {delta_file!r} must be a plain file name matching "
            f"{_DELTA_FILE.pattern} (it is resolved inside the task's prefix {prefix})"
        )
    loss = metrics.get("loss")
    if isinstance(loss, bool) or not isinstance(loss, numbers.Real) or not math.isfinite(loss):
        raise ValueError(f"task {task}: metrics.json loss must be a finite number, got {loss!r}")
    key = prefix + delta_file
    delta = artifact_json(call(f"get_artifact({key})", lambda: coord.get_artifact(key)), key)
    return delta, metrics.get("samples"), float(loss)


def run_fedavg(
    coord: Coordinator,
    *,
    rounds: int,
    num_shards: int,
    min_participants: int,
    worker_params: dict[str, Any],
    initial_weights: dict[str, Any],
    round_timeout_s: float = 600.0,
    poll_seconds: float = 1.0,
    lease_seconds: float = FEDAVG_LEASE_SECONDS,
    on_round: Callable[[RoundResult], None] | None = None,
    start_round: int = 0,
    weights_uri: str | None = None,
    image: str = DEFAULT_IMAGE,
    isolation_tier: str = "standard",
    allow_fallback: bool = False,
    pool: str | None = None,
    poll_attempts: int = 4,
    poll_backoff_s: float = 0.5,
    prior_job_ids: Sequence[tuple[int, str]] | None = None,
    build_round: BuildRound | None = None,
    compact: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    backend: str = "leases",
) -> dict[str, Any]:
    """Run rounds ``start_round .. rounds-1``; → ``{"weights", "history", "job_ids"}``.

    Each round is one job of the coordinator's ``backend``: ``"leases"`` (its agents), or
    ``"ray"`` on a coordinator with a Ray backend.

    ``initial_weights`` must be what the first round's workers start from: with ``weights_uri``
    None, ``fedavg_worker`` starts from its seeded init, i.e. ``state_to_blob(build_model(params))``.
    ``{}`` bootstraps (the first reduced blob *becomes* the weights), which suits
    workers whose first-round "delta" is a full model. ``compact`` publishes weights as
    ``f64le-b64`` entries, and workers then answer in kind. ``clock``/``sleep`` are injectable.
    """
    if isinstance(min_participants, bool) or not isinstance(min_participants, int) or not (
        isinstance(num_shards, int) and 1 <= min_participants <= num_shards
    ):
        exceeds = isinstance(num_shards, int) and isinstance(min_participants, int) and min_participants > num_shards
        raise ValueError(
            f"run_fedavg: min_participants must satisfy 1 <= min_participants <= num_shards; "
            f"got min_participants={min_participants!r}, num_shards={num_shards!r}"
            + ("; min_participants exceeds num_shards, so no round could reach quorum" if exceeds else "")
        )
    if isinstance(poll_attempts, bool) or not isinstance(poll_attempts, int) or poll_attempts < 1:
        raise ValueError(f"run_fedavg: poll_attempts must be an int >= 1, got {poll_attempts!r}")
    call = _Caller(poll_attempts, poll_backoff_s, clock, sleep)
    weights: dict[str, Any] = initial_weights
    history: list[RoundResult] = []
    job_ids: list[tuple[int, str]] = [tuple(p) for p in (prior_job_ids or [])]  # type: ignore[misc]

    def default_body(r: int, uri: str | None) -> dict[str, Any]:
        return _round_body(
            r, num_shards, worker_params, uri, lease_seconds, image, isolation_tier, allow_fallback, pool, backend
        )

    for r in range(start_round, rounds):
        plan = _plan(r, weights_uri, build_round, min_participants, default_body, num_shards)
        try:
            submitted = coord.submit(plan["body"])
        except Exception as exc:
            if is_transient(exc):  # not retried: a repeated POST could create the round twice
                raise CoordinatorUnavailable(f"submitting round {r} failed: {exc}; nothing was retried") from exc
            raise
        job_id = str(submitted["job_id"])
        job_ids.append((r, job_id))
        frozen = _wait_for_quorum(
            coord, job_id, r, plan["task_ids"], min_participants, round_timeout_s, poll_seconds, call
        )
        pulled = [_contribution(coord, job_id, task, call) for task in frozen]
        try:
            reduced, events = reduce_deltas_with_report([(delta, samples) for delta, samples, _ in pulled])
        except ValueError as exc:
            if hasattr(exc, "add_note"):
                exc.add_note(f"round {r} contributions by index: {', '.join(frozen)} (job {job_id})")
            raise
        total = sum(samples for _, samples, _ in pulled)
        mean_loss = sum(samples * loss for _, samples, loss in pulled) / total
        if not weights:
            weights = require_finite(reduced, f"round {r} bootstrap weights")
        else:
            weights = apply_delta(weights, reduced)
        key = f"jobs/{job_id}/round-{r:03d}/weights.json"
        body = encode(decode(weights), compact=True) if compact else weights
        call(f"put_artifact({key})", lambda: coord.put_artifact(key, body))
        weights_uri = "artifact://" + key
        result: RoundResult = {
            "round": r,
            "participants": len(frozen),
            "mean_loss": mean_loss,
            "job_id": job_id,
            "clipped": [
                {"task_id": frozen[e.index], "norm": e.norm, "cap": e.cap, "scale": e.scale} for e in events
            ],
        }
        history.append(result)
        if on_round is not None:
            on_round(result)
    return {"weights": weights, "history": history, "job_ids": job_ids}


def _published_weights(raw: Any, key: str) -> Any:
    """The JSON of a published weights artifact, as ``get_artifact`` returned it (parsed already,
    or bytes/str); a blank one reads as empty (``{}``), a malformed one raises its decode error
    with ``key`` in the message (same exception type)."""
    if not isinstance(raw, (bytes, bytearray, str)):
        return artifact_json(raw, key)
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise json.JSONDecodeError(f"resume_state: {key} is not valid JSON ({exc.msg})", exc.doc, exc.pos) from None
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(
            exc.encoding, exc.object, exc.start, exc.end, f"{exc.reason}; resume_state: {key} is not valid JSON"
        ) from None


def resume_state(coord: Coordinator, job_ids: Sequence[tuple[int, str]]) -> tuple[int, dict[str, Any], str | None]:
    """``(next_round, weights, weights_uri)`` from the newest round whose weights were published."""
    pairs: list[tuple[int, int, str]] = []
    for position, item in enumerate(job_ids):
        if isinstance(item, (str, bytes)):
            raise TypeError(
                f"resume_state: job_ids must hold (round, job_id) pairs as run_fedavg returns them, "
                f"got the bare string {item!r}"
            )
        r, job_id = item
        pairs.append((r, position, job_id))
    # newest round first; for a round listed twice, the later attempt first
    for r, _, job_id in sorted(pairs, reverse=True):
        key = f"jobs/{job_id}/round-{r:03d}/weights.json"
        try:
            raw = coord.get_artifact(key)
        except ArtifactNotFound:
            continue
        weights = _published_weights(raw, key)
        if not weights:
            raise RuntimeError(
                f"resume_state: {key} is present but empty; a committed round always publishes weights, "
                "so this artifact is corrupt — remove that round from job_ids to resume from an older one"
            )
        require_finite(weights, key)
        return r + 1, weights, "artifact://" + key
    if pairs and min(r for r, _, _ in pairs) > 0:
        raise RuntimeError(
            f"resume_state: no published weights for any listed round, and the earliest listed round is "
            f"{min(r for r, _, _ in pairs)} > 0 (a history gap); pass the job ids from round 0 on"
        )
    return 0, {}, None
