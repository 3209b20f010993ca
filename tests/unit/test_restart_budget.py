"""The restart budget decides relaunch-or-stop and words a decision it cut short, once for
the attempt loop and the failure summary alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashruntime.protocol.v1alpha1 import FailureClass
from flashruntime.recovery import COORDINATED, INDEPENDENT, RestartBudget, decide

ROOT = Path(__file__).resolve().parents[2] / "flashruntime"


def test_a_budget_of_two_relaunches_twice_then_stops_and_says_so() -> None:
    budget = RestartBudget(2)
    crash = decide(FailureClass.WORKER_CRASH, COORDINATED)
    assert budget.attempts == 3
    assert [budget.relaunches(restart, crash) for restart in range(3)] == [True, True, False]
    assert [budget.spent_by(restart, crash) for restart in range(3)] == [False, False, True]
    words = budget.words(str(crash.action), crash.reason, spent=True)
    assert words == f"restart_group — {crash.reason}; no restarts left (max_restarts=2)"
    assert budget.words(str(crash.action), crash.reason, spent=False) == f"restart_group — {crash.reason}"


def test_a_decision_to_fail_the_job_is_never_relaunched_and_spends_nothing() -> None:
    budget = RestartBudget(5)
    bug = decide(FailureClass.APPLICATION_ERROR, INDEPENDENT)
    assert not budget.relaunches(0, bug) and not budget.spent_by(5, bug)


def test_no_budget_means_one_attempt() -> None:
    budget = RestartBudget(0)
    retry = decide(FailureClass.WORKER_CRASH, INDEPENDENT)
    assert budget.attempts == 1 and not budget.relaunches(0, retry) and budget.spent_by(0, retry)


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"])
def test_a_budget_that_is_no_count_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="max_restarts must be an integer >= 0"):
        RestartBudget(value)  # type: ignore[arg-type]


def test_the_wording_of_a_spent_budget_exists_once_in_the_library() -> None:
    sources = [path for path in ROOT.rglob("*.py") if "no restarts left" in path.read_text(encoding="utf-8")]
    assert [path.relative_to(ROOT).as_posix() for path in sources] == ["recovery/budget.py"]
