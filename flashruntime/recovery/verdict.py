"""One answer to "an attempt failed: what now?" for every place an attempt runs: a local run
(``flash.submit``), a worker agent's task and a task on the Ray backend. The same exit code
and log tail give the same class, evidence and decision everywhere. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from flashruntime.protocol.v1alpha1 import FailureClass, RecoveryActionType, RecoveryDecision
from flashruntime.recovery.policy import decide
from flashruntime.recovery.signals import describe_launch, from_local_launch
from flashruntime.recovery.taxonomy import classify

__all__ = ["AttemptVerdict", "judge_exit", "judge_hang", "judge_no_result"]


@dataclass(frozen=True)
class AttemptVerdict:
    """The class of a failed attempt, the words naming its evidence, and the policy's decision."""

    failure_class: FailureClass
    evidence: str
    decision: RecoveryDecision

    @property
    def retry(self) -> bool:
        """Whether the decision runs the work again (anything but failing the job)."""
        return self.decision.action != RecoveryActionType.FAIL_JOB

    def line(self) -> str:
        """``worker_crash (killed by SIGKILL) -> retry_task: transient worker crash: retry the task``"""
        return f"{self.failure_class} ({self.evidence}) -> {self.decision.action}: {self.decision.reason}"


def judge_exit(exit_code: int | None, log_tail: str | None, mode: str, *,
               at: datetime | None = None) -> AttemptVerdict:
    """The verdict on an attempt that exited ``exit_code`` with ``log_tail`` as its last output,
    in recovery ``mode`` (``independent_tasks`` or ``coordinated_training``)."""
    failure = classify(from_local_launch(exit_code, log_tail))
    evidence = describe_launch(exit_code, log_tail)
    return AttemptVerdict(failure, evidence, decide(failure, mode, {"evidence": evidence}, at=at))


def judge_no_result(mode: str, *, at: datetime | None = None) -> AttemptVerdict:
    """The verdict on a task whose command exited 0 without writing ``metrics.json``: the
    command does not do what a task must, and would not on a retry."""
    evidence = "exit 0 without metrics.json"
    failure = FailureClass.APPLICATION_ERROR
    return AttemptVerdict(failure, evidence, decide(failure, mode, {"evidence": evidence}, at=at))


_HANG_EVIDENCE_CHARS = 500  # a watch's words travel from workers and Ray nodes: bounded before they are kept


def judge_hang(evidence: str, mode: str, *, at: datetime | None = None) -> AttemptVerdict:
    """The verdict on an attempt its hang watch stopped (``evidence``: which ranks stopped
    advancing, and for how long, kept to its first 500 characters): transient, run again
    from the last valid checkpoint."""
    failure = FailureClass.HANG
    evidence = evidence[:_HANG_EVIDENCE_CHARS]
    return AttemptVerdict(failure, evidence, decide(failure, mode, {"evidence": evidence}, at=at))
