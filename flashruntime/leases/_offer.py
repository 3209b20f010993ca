"""How ``claim`` offers the pending queue to a placement policy.

A first-eligible policy sees the queue page by page and the walk stops at the first
page that yields a choice (O(log n + skipped)); a policy that overrides ``score``
ranks the whole pending scope in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PAGE_SIZE = 256  # pending specs offered to a first-eligible policy per call

PendingPage = Callable[[int, int], list[Any]]  # (after_seq, limit) -> records in queue order


def offer_pending(policy: Any, view: dict[str, Any], pending_page: PendingPage, page_size: int = PAGE_SIZE) -> Any:
    """The spec ``policy.choose`` picks from the pending scope, or None; a first-eligible
    policy is offered ``page_size`` specs at a time."""
    choose = getattr(policy, "choose", None)
    if not callable(choose):
        raise TypeError(f"policy {type(policy).__name__} has no choose(pending, node) method")
    if _policy_ranks(policy):
        specs = []
        after = -1
        while True:
            page = pending_page(after, page_size)
            specs.extend(record.spec for record in page)
            if len(page) < page_size:
                break
            after = page[-1].seq
        return choose(specs, view) if specs else None
    after = -1
    while True:
        page = pending_page(after, page_size)
        if not page:
            return None
        chosen = choose([record.spec for record in page], view)
        if chosen is not None or len(page) < page_size:
            return chosen
        after = page[-1].seq


_RANKING_BASE: list[Callable[..., Any]] = []


def _policy_ranks(policy: object) -> bool:
    """True when the policy's class overrides ``PlacementPolicy.score`` (it ranks the whole scope)."""
    if not _RANKING_BASE:
        from flashruntime.scheduler.policy import PlacementPolicy  # lazy: scheduler is optional here

        _RANKING_BASE.append(PlacementPolicy.score)
    score = getattr(type(policy), "score", None)
    return score is not None and score is not _RANKING_BASE[0]
