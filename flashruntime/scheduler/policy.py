"""The placement contract: ``eligible`` (may this node run this task?), ``score``
(how much it wants it) and ``choose`` (the pick among a pending queue)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from flashruntime.protocol.v1alpha1 import TaskSpec

__all__ = ["FifoPlacement", "NodeView", "PlacementPolicy"]

NodeView = dict[str, Any]
"""What a policy knows of a node: ``node_id``, capability flags, ``capabilities``, ``local_datasets``..."""


class PlacementPolicy(abc.ABC):
    """Eligibility and rank of pending tasks for a node. Pure: no I/O, no clock."""

    @abc.abstractmethod
    def eligible(self, task: TaskSpec, node: NodeView) -> bool:
        """May ``node`` run ``task``?"""

    def score(self, task: TaskSpec, node: NodeView) -> float:
        """Preference among eligible tasks (higher wins); the default ranks all equally."""
        return 0.0

    def choose(self, pending: Sequence[TaskSpec], node: NodeView) -> TaskSpec | None:
        """Among eligible tasks, the first in queue order with the strictly highest score;
        ``None`` when none is eligible. A NaN score ranks below every number."""
        eligible = self.eligible
        if type(self).score is PlacementPolicy.score:  # every score equal: the first eligible wins
            for task in pending:
                if eligible(task, node):
                    return task
            return None
        best: TaskSpec | None = None
        best_score = 0.0
        for task in pending:
            if not eligible(task, node):
                continue
            score = self.score(task, node)
            if score != score:  # NaN
                score = float("-inf")
            if best is None or score > best_score:
                best, best_score = task, score
        return best


class FifoPlacement(PlacementPolicy):
    """Every task is eligible everywhere: the queue order decides."""

    def eligible(self, task: TaskSpec, node: NodeView) -> bool:
        return True
