"""Placement: which pending task a node may take.

``PlacementPolicy`` decides eligibility and rank; ``FifoPlacement`` takes the
queue as it is; ``IsolationAwarePlacement`` applies the eight gates. Policies
are pure and know nothing of leases: ``LeaseManager.claim`` uses any object with
``choose(pending, node)``.
"""

from flashruntime.scheduler.gates import IsolationAwarePlacement
from flashruntime.scheduler.policy import FifoPlacement, NodeView, PlacementPolicy

__all__ = ["NodeView", "PlacementPolicy", "FifoPlacement", "IsolationAwarePlacement"]
