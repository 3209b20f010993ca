"""A worker's outputs meet a coordinator's refusals: a file over the upload limit fails the
task saying it was too large (not that the coordinator was unreachable), and an empty file
or an empty task log, of which a coordinator keeps no artifact, is left out while the task
completes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_worker import argv_payload, make_agent, run_agent
from tests.worker_fake_coordinator import FakeCoordinator, Recorded

LIMIT_DETAIL = "the artifact is over the coordinator's limit of 1 MiB (FLASHML_MAX_ARTIFACT_MB)"
OUTPUTS = ("import json, os; out = os.environ['FLASHML_OUTPUT_DIR']; "
           "json.dump({{'ok': 1}}, open(os.path.join(out, 'metrics.json'), 'w')); "
           "open(os.path.join(out, 'empty.txt'), 'w').close(); "
           "open(os.path.join(out, 'big.bin'), 'wb').write(b'x' * {size})")


class LimitedCoordinator(FakeCoordinator):
    """The fake coordinator with an upload limit of 1 MiB, refused as the coordinator does."""

    def route(self, r: Recorded) -> tuple[int, Any]:
        if r.method == "PUT" and r.path.startswith("/v1alpha1/artifacts/"):
            if len(r.body) > 1 << 20:
                return 413, {"detail": LIMIT_DETAIL}
            if not r.body:
                return 400, {"detail": "the artifact body is empty: an artifact holds at least one byte"}
        return super().route(r)


@pytest.fixture
def coordinator() -> Iterator[LimitedCoordinator]:
    fake = LimitedCoordinator()
    fake.start()
    yield fake
    fake.stop()


def test_an_output_over_the_limit_fails_the_task_as_too_large(coordinator: LimitedCoordinator,
                                                             tmp_path: Path) -> None:
    lease_id = coordinator.add_lease(argv_payload(OUTPUTS.format(size=(1 << 20) + 1)))
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)) == 0
    assert coordinator.failed == {lease_id: f"upload of 'big.bin' refused: too large: {LIMIT_DETAIL}"}
    assert coordinator.completed == {}


def test_an_empty_output_is_left_out_and_the_task_completes(coordinator: LimitedCoordinator, tmp_path: Path) -> None:
    lease_id = coordinator.add_lease(argv_payload(OUTPUTS.format(size=10)))
    assert run_agent(make_agent(coordinator, tmp_path, runner="trusted", max_tasks=1)) == 0
    assert coordinator.failed == {} and lease_id in coordinator.completed
    prefix = "jobs/job1/task-000/"
    assert set(coordinator.artifacts) == {f"{prefix}metrics.json", f"{prefix}big.bin"}
    # Neither the empty file nor the task's log, empty too (it printed nothing), was sent.
    assert not coordinator.calls("PUT", f"/v1alpha1/artifacts/{prefix}(empty.txt|task.log)")
