"""``GET /v1alpha1/attempts/{id}/watch`` over real HTTP: a live lease's watch waits, a cancel
of its job answers it at once with ``cancelled``, an ended lease answers ``ended``, and the
wait is bounded below every client's timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.client import DEFAULT_TIMEOUT_S
from flashruntime.coordinator.lease_watch import MAX_WATCH_S
from tests.integration.test_service_app import _finish, job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")


@pytest.fixture
def api(tmp_path: Path) -> Any:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/v1alpha1/nodes/register", json=registration()).status_code == 200
        yield client


def _claim(api: Any) -> tuple[str, dict[str, Any]]:
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    return job_id, api.post("/v1alpha1/leases/claim", json={"node_id": "node-a", "job_id": job_id}).json()


def test_a_cancel_answers_a_waiting_watch_at_once(api: Any) -> None:
    job_id, lease = _claim(api)
    watch = f"/v1alpha1/attempts/{lease['lease_id']}/watch"
    assert api.get(watch).json() == {"lease_id": lease["lease_id"], "standing": "live"}
    answers: list[tuple[float, dict[str, Any]]] = []

    def wait() -> None:
        answers.append((time.monotonic(), api.get(watch, params={"wait_s": MAX_WATCH_S}).json()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # the watch is waiting on the coordinator
    assert not answers
    cancelled_at = time.monotonic()
    assert api.post(f"/v1alpha1/jobs/{job_id}/cancel").status_code == 200
    waiter.join(MAX_WATCH_S + 10)
    (answered_at, answer), = answers
    assert answer == {"lease_id": lease["lease_id"], "standing": "cancelled", "reason": "the task was cancelled"}
    assert answered_at - cancelled_at < MAX_WATCH_S / 2  # woken by the cancel, not by its wait running out


def test_an_ended_lease_answers_ended_and_a_live_one_waits_its_wait_out(api: Any) -> None:
    _, lease = _claim(api)
    watch = f"/v1alpha1/attempts/{lease['lease_id']}/watch"
    started = time.monotonic()
    assert api.get(watch, params={"wait_s": 0.3}).json()["standing"] == "live"
    assert time.monotonic() - started >= 0.3
    _finish(api, lease)
    ended = api.get(watch, params={"wait_s": MAX_WATCH_S}).json()
    assert ended["standing"] == "ended" and "already committed" in ended["reason"]


def test_the_wait_is_bounded_below_the_client_timeout(api: Any) -> None:
    _, lease = _claim(api)
    assert MAX_WATCH_S < DEFAULT_TIMEOUT_S
    for wait_s in (-1, MAX_WATCH_S + 1, "long"):
        answer = api.get(f"/v1alpha1/attempts/{lease['lease_id']}/watch", params={"wait_s": wait_s})
        assert answer.status_code == 422, answer.text
    assert api.get("/v1alpha1/attempts/ls-unknown/watch").status_code == 404
