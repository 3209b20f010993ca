"""``PlacementPolicy.choose``: first eligible in queue order, or the first with the
strictly highest score; and the scheduler package imports no lease code."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from flashruntime.protocol.v1alpha1 import TaskSpec
from flashruntime.scheduler import FifoPlacement, IsolationAwarePlacement, NodeView, PlacementPolicy


def task(task_id: str, **payload: Any) -> TaskSpec:
    return TaskSpec(task_id=task_id, job_id="j", commit_key=task_id, payload=payload)


def test_placement_policy_is_abstract() -> None:
    with pytest.raises(TypeError):
        PlacementPolicy()  # type: ignore[abstract]


def test_fifo_takes_the_queue_head() -> None:
    queue = [task("a"), task("b")]
    assert FifoPlacement().choose(queue, {"node_id": "n"}) is queue[0]
    assert FifoPlacement().choose([], {"node_id": "n"}) is None
    assert FifoPlacement().score(queue[0], {}) == 0.0
    assert NodeView == dict[str, Any]


def test_choose_skips_ineligible_over_a_mixed_queue() -> None:
    queue = [task("gpu", gpus=4), task("pool", pool="x"), task("plain"), task("plain-2")]
    assert IsolationAwarePlacement().choose(queue, {"node_id": "n"}) is queue[2]
    assert IsolationAwarePlacement().choose(queue[:2], {"node_id": "n"}) is None


def test_highest_score_wins_ties_go_to_queue_order() -> None:
    class ByPriority(FifoPlacement):
        def score(self, task: TaskSpec, node: NodeView) -> float:
            return task.payload.get("p", 0.0)

    queue = [task("a", p=1), task("b", p=3), task("c", p=3), task("d", p=float("nan")), task("e", p=2)]
    assert ByPriority().choose(queue, {}) is queue[1]
    assert ByPriority().choose([queue[3], queue[0]], {}) is queue[0]  # NaN ranks below every number
    assert ByPriority().choose([queue[3]], {}) is queue[3]


def test_scheduler_does_not_import_leases() -> None:
    code = (
        "import sys, flashruntime.scheduler;"
        "print(sorted(m for m in sys.modules if m.startswith('flashruntime.leases')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
