"""``run_in_transaction``: a transaction that lost a race is rolled back and run again as a
whole, a few times, after short jittered pauses; nothing else is rerun. A fake database
stands in for PostgreSQL: it reports a deadlock the way ``PostgresDatabase`` does (a
``StoreError`` whose cause carries SQLSTATE 40P01)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from flashruntime.coordinator.state import TRANSACTION_ATTEMPTS, InTransaction, run_in_transaction
from flashruntime.errors import LeaseError, StoreError
from flashruntime.postgres_database import is_retryable


class _Sqlstate(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def lost_race(sqlstate: str = "40P01") -> StoreError:
    error = StoreError("the transaction was rolled back after a deadlock; run it again")
    error.__cause__ = _Sqlstate(sqlstate)
    return error


class FakeDatabase:
    """Transactions that commit ``committed`` and record after-commit callbacks per thread, as
    ``PostgresDatabase`` does; ``fail_commits`` makes the next commits fail with that error."""

    def __init__(self, *, knows_transactions: bool = True) -> None:
        self._local = threading.local()
        self.begun = 0
        self.committed: list[list[str]] = []
        self.fail_commits: list[BaseException] = []
        if not knows_transactions:
            self.in_transaction = None  # type: ignore[assignment]  # as SqliteDatabase: no way to tell

    def in_transaction(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self.begun += 1
            self._local.writes, self._local.callbacks = [], []
        self._local.depth = depth + 1
        try:
            yield
        except BaseException:
            self._local.depth -= 1
            if self._local.depth == 0:
                self._local.writes, self._local.callbacks = [], []  # rolled back, callbacks dropped
            raise
        self._local.depth -= 1
        if self._local.depth == 0:
            if self.fail_commits:
                self._local.writes, self._local.callbacks = [], []
                raise self.fail_commits.pop(0)
            self.committed.append(self._local.writes)
            for callback in self._local.callbacks:
                callback()

    def write(self, what: str) -> None:
        self._local.writes.append(what)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._local.callbacks.append(callback)

    def close(self) -> None:
        pass


def test_what_counts_as_a_lost_race() -> None:
    assert is_retryable(lost_race("40P01")) and is_retryable(lost_race("40001"))
    assert is_retryable(_Sqlstate("40P01"))
    assert not is_retryable(lost_race("23505")) and not is_retryable(StoreError("disk full"))
    assert not is_retryable(RuntimeError("no cause"))


def test_a_lost_race_runs_the_whole_transaction_again_and_commits_it_once() -> None:
    db = FakeDatabase()
    pauses: list[float] = []
    ran, observed = [], []

    def work() -> str:
        ran.append(len(ran) + 1)
        db.write(f"event of run {len(ran)}")
        db.after_commit(lambda: observed.append(len(ran)))
        if len(ran) < 3:
            raise lost_race()
        return "done"

    assert run_in_transaction(db, work, sleep=pauses.append, jitter=lambda: 0.5) == "done"
    assert ran == [1, 2, 3] and db.begun == 3
    assert db.committed == [["event of run 3"]]  # the rolled-back runs left nothing
    assert observed == [3]  # the callbacks of the rolled-back runs never ran; the last one's once
    assert pauses == [0.01, 0.02]  # doubled each time (jitter 0.5 is the middle: x1)


def test_a_failed_commit_that_lost_a_race_is_run_again_too() -> None:
    db = FakeDatabase()
    db.fail_commits = [lost_race("40001")]
    runs: list[int] = []
    assert run_in_transaction(db, lambda: runs.append(1) or len(runs), sleep=lambda s: None) == 2
    assert len(db.committed) == 1


def test_after_the_last_attempt_the_race_is_reported() -> None:
    db = FakeDatabase()
    pauses: list[float] = []
    runs: list[int] = []

    def work() -> None:
        runs.append(1)
        raise lost_race()

    with pytest.raises(StoreError, match="run it again"):
        run_in_transaction(db, work, sleep=pauses.append, jitter=lambda: 0.0)
    assert len(runs) == TRANSACTION_ATTEMPTS and db.committed == []
    assert pauses == [0.005, 0.01, 0.02, 0.04]  # jitter 0 halves each pause; never more than the cap
    pauses.clear()
    with pytest.raises(StoreError):
        run_in_transaction(db, work, attempts=9, sleep=pauses.append, jitter=lambda: 0.999)
    assert max(pauses) < 0.3


@pytest.mark.parametrize("error", [StoreError("disk full"), lost_race("23505"), ValueError("bad input")])
def test_any_other_failure_is_not_run_again(error: BaseException) -> None:
    db = FakeDatabase()
    runs: list[int] = []

    def work() -> None:
        runs.append(1)
        raise error

    with pytest.raises(type(error)):
        run_in_transaction(db, work, sleep=lambda s: None)
    assert runs == [1]


def test_inside_an_enclosing_transaction_the_race_goes_to_the_outermost_which_reruns_the_whole() -> None:
    db = FakeDatabase()
    inner_runs, outer_runs = [], []

    def inner() -> None:
        inner_runs.append(1)
        db.write("inner")
        if len(inner_runs) == 1:
            raise lost_race()

    def outer() -> None:
        outer_runs.append(1)
        db.write("outer")
        run_in_transaction(db, inner, sleep=lambda s: None)

    run_in_transaction(db, outer, sleep=lambda s: None)
    assert (len(outer_runs), len(inner_runs)) == (2, 2) and db.committed == [["outer", "inner"]]


def test_a_database_that_cannot_tell_is_never_rerun() -> None:
    db = FakeDatabase(knows_transactions=False)
    runs: list[int] = []

    def work() -> None:
        runs.append(1)
        raise lost_race()

    with pytest.raises(StoreError):
        run_in_transaction(db, work, sleep=lambda s: None)
    assert runs == [1]


def test_in_transaction_reruns_a_call_and_commits_a_refusal_with_what_it_wrote() -> None:
    db = FakeDatabase()

    class Target:
        store = "passes through"

        def __init__(self) -> None:
            self.calls = 0

        def transition(self, value: int) -> int:
            self.calls += 1
            db.write(f"transition {value}, call {self.calls}")
            if self.calls == 1:
                raise lost_race()
            return value * 2

        def refuse(self) -> None:
            db.write("refusal recorded")
            raise LeaseError("lease is no longer live")

    target = Target()

    def run(work: Callable[[], Any]) -> Any:
        return run_in_transaction(db, work, sleep=lambda s: None)

    wrapped: Any = InTransaction(target, run, refusals=(LeaseError,))
    assert wrapped.transition(21) == 42 and target.calls == 2
    with pytest.raises(LeaseError, match="no longer live"):
        wrapped.refuse()
    assert db.committed == [["transition 21, call 2"], ["refusal recorded"]]
    assert wrapped.store == "passes through"
