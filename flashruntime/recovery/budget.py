"""A run's restart budget: how many relaunches follow its first attempt, whether a failed
attempt is relaunched, and the one wording of a decision the budget cut short.

The recovery table (``recovery.policy``) says what a failure calls for; the budget says
whether the run can still afford it. The attempt loop asks it before every relaunch and
the failure summary words a recorded decision through it, so the two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashruntime.protocol.v1alpha1 import RecoveryActionType, RecoveryDecision

__all__ = ["RestartBudget"]


@dataclass(frozen=True)
class RestartBudget:
    """``max_restarts`` relaunches after the first attempt; attempt ``restart`` 0 is the first."""

    max_restarts: int

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")

    @property
    def attempts(self) -> int:
        """The most attempts a run makes: the first and every restart."""
        return self.max_restarts + 1

    def spent_by(self, restart: int, decision: RecoveryDecision) -> bool:
        """Whether attempt ``restart`` ended with a decision to go on that the budget cannot pay."""
        return decision.action != RecoveryActionType.FAIL_JOB and restart >= self.max_restarts

    def relaunches(self, restart: int, decision: RecoveryDecision) -> bool:
        """Whether attempt ``restart``, failed with ``decision``, is followed by another attempt."""
        return decision.action != RecoveryActionType.FAIL_JOB and restart < self.max_restarts

    def words(self, action: str, reason: str, *, spent: bool) -> str:
        """A decision in words: ``"<action> — <reason>"``, and that no restart is left when
        the budget was ``spent`` (see ``spent_by``)."""
        text = f"{action} — {reason}"
        if spent:
            text += f"; no restarts left (max_restarts={self.max_restarts})"
        return text
