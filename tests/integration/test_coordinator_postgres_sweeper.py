"""One expiry sweeper among coordinator replicas sharing a PostgreSQL database: the
replica holding the sweeper lock sweeps, the others do nothing; when the holder closes or
its connection is lost, another takes over at its next sweep. Two deployments in two
schemas of one database each have their own sweeper."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.job_views import task_rows
from flashruntime.coordinator.state import CoordinatorState, open_state
from flashruntime.protocol.v1alpha1 import JobSpec, NodeRegistration
from tests.postgres_server import PostgresCluster
from tests.service_server import settings_for


@pytest.fixture
def replicas(tmp_path: Path, postgres_url: str) -> Iterator[list[CoordinatorState]]:
    opened = [open_state(settings_for(tmp_path / f"r{index}", database_url=postgres_url)) for index in range(2)]
    yield opened
    for state in opened:
        state.close()


def test_one_replica_at_a_time_holds_the_sweep_and_another_takes_over_when_it_closes(
        replicas: list[CoordinatorState]) -> None:
    first, second = replicas
    assert first.sweep_turn() is True
    assert [second.sweep_turn(), first.sweep_turn(), second.sweep_turn()] == [False, True, False]
    first.close()
    assert second.sweep_turn() is True and second.sweep_turn() is True


def test_a_holder_whose_connection_is_lost_loses_the_sweep_to_another(
        replicas: list[CoordinatorState], postgres_cluster: PostgresCluster) -> None:
    first, second = replicas
    assert first.sweep_turn() is True and second.sweep_turn() is False
    import psycopg

    with psycopg.connect(postgres_cluster.url(postgres_cluster.test_database or "postgres"),
                         autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a JOIN pg_locks l "
                              "ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted "
                              "WHERE a.application_name LIKE 'flashruntime expiry sweeper%%'").fetchall()
    assert ended == [(True,)]  # the holder's session; the other replica's waits without the lock
    assert first.sweep_turn() is False  # its connection is gone, and the lock with it
    assert second.sweep_turn() is True
    assert first.sweep_turn() is False  # reconnected, but the lock is the other's now


def test_only_the_replica_whose_turn_it_is_expires_leases(tmp_path: Path, postgres_url: str) -> None:
    coordinators = [Coordinator(settings_for(tmp_path / f"c{index}", database_url=postgres_url)) for index in range(2)]
    try:
        first, second = coordinators
        spec = JobSpec.model_validate({
            "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "sweep-turns"},
            "spec": {"execution": {"backend": "leases"},
                     "workload": {"type": "hyperparameter_search",
                                  "parameters": {"trials": [{"i": 1}], "lease_seconds": 5}}}})
        job_id = first.submit(spec).job_id
        first.nodes.register(NodeRegistration(node_id="n", kubernetes_node="", hostname="n",
                                              capabilities={"cpu_cores": 1}))
        assert first.manager.claim("n", job_id=job_id, now=first.now()) is not None
        assert first.sweep_once() == 0  # the sweeper, but nothing is overdue yet
        later = first.now() + timedelta(seconds=60)
        for coordinator in coordinators:
            coordinator.now = lambda: later  # type: ignore[method-assign]
        assert second.sweep_once() == 0 and _state(second, job_id) == "LEASED"  # not its turn
        assert first.sweep_once() == 1 and _state(second, job_id) == "PENDING"
    finally:
        for coordinator in coordinators:
            coordinator.close()


def _state(coordinator: Coordinator, job_id: str) -> Any:
    [row] = task_rows(coordinator, job_id)
    return row["state"]


def test_two_schemas_of_one_database_each_have_their_own_sweeper(
        tmp_path: Path, postgres_cluster: PostgresCluster) -> None:
    schemas = [postgres_cluster.create_schema() for _ in range(2)]
    database = postgres_cluster.test_database or "postgres"
    states = [open_state(settings_for(tmp_path / schema, database_url=postgres_cluster.url(database, schema)))
              for schema in schemas]
    try:
        assert [state.sweep_turn() for state in states] == [True, True]
    finally:
        for state in states:
            state.close()
        for schema in schemas:
            postgres_cluster.drop_schema(schema)
