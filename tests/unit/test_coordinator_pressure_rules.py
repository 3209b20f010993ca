"""The coordinator's rules under pressure, as pure pieces: failed-authentication counting,
the free-space floor, disk-full errors, connection bounds, accept-error throttling, tokens
in URLs, checkpoint paths, strict capability flags and the shortest lease a job may ask."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from flashruntime.coordinator.checkpoint_paths import checkpoint_path_problem
from flashruntime.coordinator.disk_space import free_bytes, is_disk_full, space_problem
from flashruntime.coordinator.rate_limit import FailureCounter
from flashruntime.errors import StorageFull, StoreError
from flashruntime.protocol.lease_rules import MIN_LEASE_SECONDS, bounded_lease_seconds
from flashruntime.protocol.v1alpha1 import NodeRegistration
from tests._support import FakeClock

# --- failed authentications ----------------------------------------------------------------


def test_an_address_is_blocked_after_limit_failures_until_its_window_ends() -> None:
    clock = FakeClock()
    counter = FailureCounter(3, 60.0, clock=clock)
    for _ in range(2):
        counter.record("10.0.0.1")
        assert counter.blocked("10.0.0.1") is None
    counter.record("10.0.0.1")
    assert counter.blocked("10.0.0.1") == pytest.approx(60.0)
    assert counter.blocked("10.0.0.2") is None  # other addresses are not touched
    clock.sleep(59.0)
    assert counter.blocked("10.0.0.1") == pytest.approx(1.0)
    clock.sleep(1.0)
    assert counter.blocked("10.0.0.1") is None  # a new window
    counter.record("10.0.0.1")
    assert counter.blocked("10.0.0.1") is None  # one failure of three in it


def test_the_failure_table_stays_bounded_however_many_addresses_fail() -> None:
    clock = FakeClock()
    counter = FailureCounter(2, 60.0, max_keys=100, clock=clock)
    counter.record("first")
    counter.record("first")
    for number in range(1000):
        clock.sleep(0.001)
        counter.record(f"10.0.{number // 256}.{number % 256}")
        assert len(counter) <= 100
    # Failing once from each of many new addresses does not free a blocked one.
    assert counter.blocked("first") is not None
    for number in range(100):  # a table of blocked addresses only: then the least recent gives way
        counter.record(f"b-{number}")
        counter.record(f"b-{number}")
        assert len(counter) <= 100
    assert counter.blocked("first") is None and counter.blocked("b-99") is not None


@pytest.mark.parametrize("limit, window", [(0, 60.0), (True, 60.0), (5, 0.0), (5, float("inf"))])
def test_failure_counter_refuses_settings_it_cannot_apply(limit: Any, window: Any) -> None:
    with pytest.raises(ValueError, match="must be"):
        FailureCounter(limit, window)


# --- disk space ------------------------------------------------------------------------------


def test_space_problem_names_the_directory_the_floor_and_its_setting(tmp_path: Path) -> None:
    free = {str(tmp_path / "a"): 10 << 20, str(tmp_path / "b"): 1 << 20}
    problem = space_problem([tmp_path / "a", tmp_path / "b"], 2 << 20, free_of=lambda path: free[str(path)])
    assert problem is not None and str(tmp_path / "b") in problem
    assert "FLASHML_MIN_FREE_BYTES" in problem and str(2 << 20) in problem
    assert space_problem([tmp_path / "a"], 2 << 20, free_of=lambda path: free[str(path)]) is None
    assert space_problem([tmp_path / "b"], 0, free_of=lambda path: 0) is None  # no floor


def test_free_bytes_reads_a_directory_not_made_yet_from_its_parent(tmp_path: Path) -> None:
    assert free_bytes(tmp_path / "not" / "yet") == free_bytes(tmp_path) > 0


def test_disk_full_is_recognised_through_the_errors_it_was_raised_from() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(StorageFull(errno.ENOSPC, "below the floor"))
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13  # type: ignore[attr-defined]
    try:
        raise StoreError("the database failed") from full
    except StoreError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(StoreError("locked"))


def test_postgresql_s_disk_full_is_recognised_as_a_full_disk() -> None:
    errors = pytest.importorskip("psycopg.errors")
    try:
        raise StoreError("the database failed") from errors.DiskFull("could not extend file: No space left on device")
    except StoreError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(errors.LockNotAvailable("locked"))


def test_an_artifact_store_below_its_floor_refuses_before_writing(tmp_path: Path) -> None:
    from flashruntime.coordinator.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "artifacts", 1 << 20, min_free_bytes=free_bytes(tmp_path) * 4)
    with pytest.raises(StorageFull, match="FLASHML_MIN_FREE_BYTES") as refused:
        store.write_bytes("users/a/x", b"payload")
    assert refused.value.errno == errno.ENOSPC
    assert not (tmp_path / "artifacts").exists()  # not even its directory was made
    assert ArtifactStore(tmp_path / "artifacts", 1 << 20).write_bytes("users/a/x", b"payload")[1] == 7


# --- connections -------------------------------------------------------------------------------


def test_connection_bound_keeps_a_reserve_of_descriptors() -> None:
    pytest.importorskip("uvicorn")
    from flashruntime.coordinator.listener import connection_bound, listen_backlog

    assert connection_bound(10_000, 1024) == 896  # an eighth kept back
    assert connection_bound(10_000, 256) == 192  # at least 64 kept back
    assert connection_bound(500, 1 << 20) == 500  # the setting, when the limit allows more
    assert connection_bound(10_000, 40) == 1
    for limit in (64, 1024, 4096, 1 << 20):
        assert connection_bound(10_000, limit) + listen_backlog(limit) <= limit  # a round of accepts fits


def test_failed_accepts_are_logged_once_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("uvicorn")
    from flashruntime.coordinator.listener import AcceptErrorThrottle

    clock = FakeClock()
    passed_on: list[dict[str, Any]] = []
    throttle = AcceptErrorThrottle(60.0, previous=lambda loop, context: passed_on.append(context), clock=clock)
    loop = asyncio.new_event_loop()
    try:
        exhausted = {"message": "socket.accept() out of system resource",
                     "exception": OSError(errno.EMFILE, "Too many open files")}
        with caplog.at_level(logging.ERROR, logger="flashruntime.service"):
            for _ in range(1000):
                throttle(loop, exhausted)
            clock.sleep(60.0)
            throttle(loop, exhausted)
        lines = [record.getMessage() for record in caplog.records]
        assert len(lines) == 2 and "999 such failures since the last line" in lines[1]
        other = {"message": "something else", "exception": RuntimeError("boom")}
        throttle(loop, other)
        assert passed_on == [other]  # every other context goes where it went before
    finally:
        loop.close()


# --- tokens in URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize("query, named", [
    ("token=abc", True), ("page=2&access_token=abc", True), ("API_KEY=abc", True), ("key=", True),
    ("page=2;token=abc", True), ("apiKey=abc", True), ("access-token=abc", True), ("X-Auth-Token=abc", True),
    ("refresh_token=abc", True), ("pass%77ord=x", True), ("client.secret=x", True),
    ("page=2", False), ("tokens=abc", False), ("", False), ("monkey=1", False), ("tail=100&task=task-000", False),
])
def test_a_query_string_names_a_token(query: str, named: bool) -> None:
    pytest.importorskip("starlette")
    from flashruntime.coordinator.url_tokens import names_a_token, redacted_path

    assert names_a_token(query) is named
    assert names_a_token(query.encode()) is named
    path = f"/v1alpha1/jobs?{query}" if query else "/v1alpha1/jobs"
    assert redacted_path(path) == ("/v1alpha1/jobs?<redacted>" if named else path)


def test_the_access_log_filter_hides_the_query_string_that_holds_a_token() -> None:
    pytest.importorskip("starlette")
    from flashruntime.coordinator.url_tokens import RedactURLTokens

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", "/v1alpha1/jobs?token=s3cret", "1.1", 401), None)
    assert RedactURLTokens().filter(record)
    assert "s3cret" not in record.getMessage() and "/v1alpha1/jobs?<redacted>" in record.getMessage()


# --- checkpoint paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("keys, prefix", [
    (["rank0.pt"], "ckpt/5/"), (["model/part-0.safetensors", ".meta"], "ckpt"), (["jobsx/a", "..."], None),
])
def test_relative_checkpoint_paths_are_accepted(keys: list[str], prefix: str | None) -> None:
    assert checkpoint_path_problem(keys, prefix) is None


@pytest.mark.parametrize("keys, prefix, named", [
    (["users/bob/model.pt"], None, "part key 'users/bob/model.pt'"),
    (["jobs/other/t/rank0.pt"], None, "part key 'jobs/other/t/rank0.pt'"),
    (["/etc/passwd"], None, "part key '/etc/passwd'"),
    (["a/../../b"], None, "part key 'a/../../b'"),
    (["a//b"], None, "part key 'a//b'"),
    (["a\\b"], None, "part key"),
    ([""], None, "part key ''"),
    (["ok"], "/etc", "storage_prefix '/etc'"),
    (["ok"], "s3://bucket/1", "storage_prefix 's3://bucket/1'"),
    (["ok"], "../up", "storage_prefix '../up'"),
])
def test_absolute_escaping_and_foreign_checkpoint_paths_are_refused(keys: list[str], prefix: str | None,
                                                                     named: str) -> None:
    problem = checkpoint_path_problem(keys, prefix)
    assert problem is not None and named in problem and "relative" in problem


# --- wire rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["module_capable", "argv_capable", "sandbox_capable", "unsandboxed_argv_capable"])
@pytest.mark.parametrize("value", [0, 1, "true", "yes"])
def test_capability_flags_are_true_or_false_only(flag: str, value: Any) -> None:
    base = {"node_id": "n", "kubernetes_node": "", "hostname": "h", "capabilities": {}}
    with pytest.raises(ValueError, match="valid boolean"):
        NodeRegistration.model_validate({**base, flag: value})
    assert getattr(NodeRegistration.model_validate_json(
        f'{{"node_id": "n", "kubernetes_node": "", "hostname": "h", "capabilities": {{}}, "{flag}": true}}'), flag)


@pytest.mark.parametrize("raw", [1e-6, 0.5, "0.999"])
def test_a_lease_shorter_than_a_second_is_refused(raw: Any) -> None:
    with pytest.raises(ValueError, match=f"at least {MIN_LEASE_SECONDS:g} s"):
        bounded_lease_seconds(raw, 60.0)
    assert bounded_lease_seconds(MIN_LEASE_SECONDS, 60.0) == MIN_LEASE_SECONDS
