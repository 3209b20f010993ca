"""What to do about a failure: the recovery table keyed by ``(FailureClass, mode)``,
its one-line rendering ``explain`` and ``replay`` of a list of failure signals.

Pure lookups: no learned or remote component, no clock except through ``at``.
Same failure, mode and ``POLICY_VERSION`` ⇒ same decision.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, NamedTuple

from flashruntime.protocol.v1alpha1 import FailureClass, RecoveryActionType, RecoveryDecision, utcnow
from flashruntime.recovery.taxonomy import POLICY_VERSION, FailureSignals, classify

__all__ = ["COORDINATED", "INDEPENDENT", "MODES", "REPLAY_EPOCH", "decide", "explain", "replay"]

# The recovery modes: tasks that stand alone, and ranks that train together.
INDEPENDENT = "independent_tasks"
COORDINATED = "coordinated_training"
MODES = (INDEPENDENT, COORDINATED)

REPLAY_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

F = FailureClass
A = RecoveryActionType


class _Entry(NamedTuple):
    action: RecoveryActionType
    scope: str
    cordon_node: bool
    needs_checkpoint: bool
    reason: str


# fmt: off
_TABLE: dict[tuple[FailureClass, str], _Entry] = {
    (F.APPLICATION_ERROR, INDEPENDENT): _Entry(A.FAIL_JOB, "job", False, False,
        "deterministic application error: a retry would fail the same way"),
    (F.APPLICATION_ERROR, COORDINATED): _Entry(A.FAIL_JOB, "job", False, False,
        "deterministic application error: a restart would fail the same way"),
    (F.DATA_ERROR, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "data error confined to one task: retry the task"),
    (F.DATA_ERROR, COORDINATED): _Entry(A.FAIL_JOB, "job", False, False,
        "data error in coordinated training: every restart would read the same data"),
    (F.WORKER_CRASH, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "transient worker crash: retry the task"),
    (F.WORKER_CRASH, COORDINATED): _Entry(A.RESTART_GROUP, "group", False, True,
        "transient worker crash: restart the group from the last valid checkpoint"),
    (F.NODE_LOSS, INDEPENDENT): _Entry(A.RETRY_TASK, "task", True, False,
        "node lost: cordon it and retry the task elsewhere"),
    (F.NODE_LOSS, COORDINATED): _Entry(A.REPLACE_NODE, "group", True, True,
        "node lost: cordon it, replace it and restart the group from the last valid checkpoint"),
    (F.ACCELERATOR_FAILURE, INDEPENDENT): _Entry(A.RETRY_TASK, "node", True, False,
        "accelerator fault: cordon the node and retry the task on another node"),
    (F.ACCELERATOR_FAILURE, COORDINATED): _Entry(A.REPLACE_NODE, "group", True, True,
        "accelerator fault: cordon the node, replace it and restart the group from the last valid checkpoint"),
    (F.COMMUNICATION_ERROR, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "communication error: retry the task"),
    (F.COMMUNICATION_ERROR, COORDINATED): _Entry(A.RESTART_GROUP, "group", False, True,
        "collective communication failed: restart the group from the last valid checkpoint"),
    (F.NETWORK_DEGRADATION, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "network degraded: retry the task"),
    (F.NETWORK_DEGRADATION, COORDINATED): _Entry(A.RESTART_GROUP, "group", False, True,
        "network degraded: restart the group from the last valid checkpoint"),
    (F.STORAGE_TIMEOUT, INDEPENDENT): _Entry(A.PAUSE_JOB, "job", False, False,
        "storage unavailable or slow: pause the job until storage recovers"),
    (F.STORAGE_TIMEOUT, COORDINATED): _Entry(A.PAUSE_JOB, "job", False, False,
        "storage unavailable or slow: pause the job until storage recovers"),
    (F.ARTIFACT_CORRUPTION, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "artifact failed verification: retry the task to produce it again"),
    (F.ARTIFACT_CORRUPTION, COORDINATED): _Entry(A.RESTART_GROUP, "group", False, True,
        "checkpoint or artifact failed verification: restart the group from the last valid checkpoint"),
    (F.PREEMPTION, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "node preempted: retry the task"),
    (F.PREEMPTION, COORDINATED): _Entry(A.REPLACE_NODE, "group", False, True,
        "node preempted: replace it and restart the group from the last valid checkpoint"),
    (F.CORRELATED_INCIDENT, INDEPENDENT): _Entry(A.FREEZE_AUTOMATION, "pool", False, False,
        "correlated failures across the pool: freeze automated recovery until an operator looks"),
    (F.CORRELATED_INCIDENT, COORDINATED): _Entry(A.FREEZE_AUTOMATION, "pool", False, False,
        "correlated failures across the pool: freeze automated recovery until an operator looks"),
    (F.CONTROL_PLANE_FAILURE, INDEPENDENT): _Entry(A.PAUSE_JOB, "job", False, False,
        "control plane unreachable: pause the job until it is back"),
    (F.CONTROL_PLANE_FAILURE, COORDINATED): _Entry(A.PAUSE_JOB, "job", False, False,
        "control plane unreachable: pause the job until it is back"),
    (F.UNKNOWN, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "unclassified failure: retry the task"),
    (F.UNKNOWN, COORDINATED): _Entry(A.PAUSE_JOB, "job", False, True,
        "unclassified failure: pause the job for an operator; it resumes from the last valid checkpoint"),
    (F.HANG, INDEPENDENT): _Entry(A.RETRY_TASK, "task", False, False,
        "hung: no progress for the hang timeout: stop it and retry the task"),
    (F.HANG, COORDINATED): _Entry(A.RESTART_GROUP, "group", False, True,
        "hung: no progress for the hang timeout: stop the group and restart it from the last valid checkpoint"),
}
# fmt: on


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown recovery mode {mode!r}; expected one of {', '.join(MODES)}")
    return mode


def decide(
    failure: FailureClass | str,
    mode: str,
    evidence: Mapping[str, Any] | None = None,
    *,
    at: datetime | None = None,
) -> RecoveryDecision:
    """The recovery decision for ``failure`` in ``mode`` (the decision table).

    ``failure`` may be a ``FailureClass`` or its value; an unknown class or mode →
    ``ValueError``. ``at`` becomes ``decided_at`` (``None`` → now).
    """
    _check_mode(mode)
    try:
        failure_class = FailureClass(failure)
    except ValueError:
        raise ValueError(
            f"unknown failure class {failure!r}; expected one of {', '.join(c.value for c in FailureClass)}"
        ) from None
    entry = _TABLE.get((failure_class, mode))
    if entry is None:  # pragma: no cover - the table is complete (a golden test checks every cell)
        raise ValueError(f"no recovery entry for ({failure_class.value}, {mode})")
    return RecoveryDecision(
        policy_version=POLICY_VERSION,
        failure_class=failure_class,
        action=entry.action,
        scope=entry.scope,  # type: ignore[arg-type]
        cordon_node=entry.cordon_node,
        needs_checkpoint=entry.needs_checkpoint,
        reason=entry.reason,
        evidence=dict(evidence) if evidence else {},
        decided_at=utcnow() if at is None else at,
    )


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _value(member: Any) -> str:
    return str(getattr(member, "value", member))


def explain(decision: RecoveryDecision) -> str:
    """One deterministic line: ``"<class> -> <action> (scope=…, cordon_node=yes|no,
    needs_checkpoint=yes|no; policy <version>): <reason>"``, plus ``" [evidence:
    <json, sorted keys>]"`` when there is evidence. ``decided_at`` is not rendered."""
    line = (
        f"{_value(decision.failure_class)} -> {_value(decision.action)} "
        f"(scope={decision.scope}, cordon_node={_yes_no(decision.cordon_node)}, "
        f"needs_checkpoint={_yes_no(decision.needs_checkpoint)}; policy {decision.policy_version}): "
        f"{decision.reason}"
    )
    if decision.evidence:
        line += f" [evidence: {json.dumps(decision.evidence, sort_keys=True, default=str)}]"
    return line


def replay(signals_list: Iterable[FailureSignals], mode: str, *, at: datetime | None = None) -> list[RecoveryDecision]:
    """Classify and decide each signals record independently (no correlation is
    inferred across the list). Evidence = ``{"index": i, "signals": <fields>}``;
    ``decided_at`` = ``at``, or 1970-01-01T00:00:00Z. Equal inputs ⇒ byte-identical JSON."""
    _check_mode(mode)
    decided_at = REPLAY_EPOCH if at is None else at
    decisions = []
    for index, signals in enumerate(signals_list):
        if not isinstance(signals, FailureSignals):
            raise TypeError(f"replay expects FailureSignals, got {type(signals).__name__} at index {index}")
        evidence = {"index": index, "signals": dataclasses.asdict(signals)}
        decisions.append(decide(classify(signals), mode, evidence, at=decided_at))
    return decisions
