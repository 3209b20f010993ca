"""Every route of the live coordinator, with every kind of credential: the access table.

A real uvicorn on 127.0.0.1 with node, submitter and operator tokens. The test reads the
routes from the live OpenAPI schema (plus the two routes kept out of it) and calls each
with no token, a wrong token, node A's token on node A's lease, node B's token on node
A's lease, attempt and write scope, the job's own submitter, another submitter, an
operator and an operator acting as node A, asserting the status documented for each.
A route without a row in ``EXPECTED`` fails the test, as does a row without a route.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

TOKENS = {
    "FLASHML_NODE_TOKENS": "node-a:tok-node-a,node-b:tok-node-b",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice,bob:tok-bob",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
    "FLASHML_ARGV_SUBMITTERS": "alice",
}
CREDENTIALS: dict[str, dict[str, str]] = {
    "none": {},
    "wrong": {"Authorization": "Bearer not-a-token"},
    "node": {"Authorization": "Bearer tok-node-a"},
    "other_node": {"Authorization": "Bearer tok-node-b"},
    "owner": {"Authorization": "Bearer tok-alice"},
    "other_submitter": {"Authorization": "Bearer tok-bob"},
    "operator": {"Authorization": "Bearer tok-root"},
    "operator_as_node": {"Authorization": "Bearer tok-root", "X-FlashML-On-Behalf-Of": "node-a"},
}
OPERATOR, OWNER, NODE = CREDENTIALS["operator"], CREDENTIALS["owner"], CREDENTIALS["node"]

OK, NO_CONTENT = 200, 204
# Outcomes by credential, in CREDENTIALS' order. A set: any of these (a claim finds work or not).
OPEN = (200,) * 8
JOB_READ = (401, 401, 403, 403, 200, 404, 200, 403)  # another submitter's job reads as unknown
NODE_ONLY = (401, 401, 200, 403, 403, 403, 401, 200)  # a header-less operator must name its node
OPERATOR_ONLY = (401, 401, 403, 403, 403, 403, 200, 403)
TASK_WRITE = (401, 401, 200, 403, 403, 403, 200, 200)
TASK_READ = (401, 401, 200, 403, 200, 404, 200, 200)
ARTIFACT_IN_LEASE = (401, 401, 200, 403, 200, 403, 200, 200)

EXPECTED: dict[tuple[str, str], tuple[Any, ...]] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/livez"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/"): OPEN,
    ("GET", "/openapi.json"): (401, 401, 200, 200, 200, 200, 200, 200),
    ("GET", "/v1alpha1/whoami"): (401, 401, 200, 200, 200, 200, 200, 200),
    ("POST", "/v1alpha1/jobs"): (401, 401, 403, 403, 201, 201, 201, 403),
    ("GET", "/v1alpha1/jobs"): (401, 401, 403, 403, 200, 200, 200, 403),
    ("GET", "/v1alpha1/jobs/{job_id}"): JOB_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/events"): JOB_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/logs"): JOB_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/metrics"): JOB_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/tasks"): JOB_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/artifacts"): JOB_READ,
    ("POST", "/v1alpha1/jobs/{job_id}/cancel"): JOB_READ,
    ("POST", "/v1alpha1/nodes/register"): (401, 401, 200, 200, 403, 403, 401, 200),
    ("POST", "/v1alpha1/nodes/{node_id}/heartbeat"): NODE_ONLY,
    ("GET", "/v1alpha1/nodes"): OPERATOR_ONLY,
    ("POST", "/v1alpha1/nodes/{node_id}/cordon"): OPERATOR_ONLY,
    ("DELETE", "/v1alpha1/nodes/{node_id}/cordon"): OPERATOR_ONLY,
    ("POST", "/v1alpha1/leases/claim"): (401, 401, {OK, NO_CONTENT}, {OK, NO_CONTENT}, 403, 403, 401,
                                         {OK, NO_CONTENT}),
    ("POST", "/v1alpha1/attempts/{lease_id}/heartbeat"): NODE_ONLY,
    ("GET", "/v1alpha1/attempts/{lease_id}/watch"): NODE_ONLY,
    ("POST", "/v1alpha1/attempts/{lease_id}/complete"): NODE_ONLY,
    ("POST", "/v1alpha1/attempts/{lease_id}/fail"): NODE_ONLY,
    ("POST", "/v1alpha1/attempts/{lease_id}/release"): NODE_ONLY,
    ("PUT", "/v1alpha1/artifacts/{key}"): ARTIFACT_IN_LEASE,
    ("GET", "/v1alpha1/artifacts/{key}"): ARTIFACT_IN_LEASE,
    ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/parts"): TASK_WRITE,
    ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/commit"): TASK_WRITE,
    ("GET", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/latest"): TASK_READ,
    ("GET", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/lost-work"): TASK_READ,
    ("GET", "/metrics"): OPERATOR_ONLY,
}
OUTSIDE_THE_SCHEMA = {("GET", "/"), ("GET", "/openapi.json")}  # the page and the schema itself


@dataclass
class Call:
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None


class World:
    """Alice's job with node A holding the lease on its first task, and factories for the
    fresh objects that a call uses up (a lease to fail, a job to cancel)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.steps = itertools.count(10)
        for token in ("tok-node-a", "tok-node-b"):
            self.ok(api.post("/v1alpha1/nodes/register", json=registration("ignored"),
                             headers={"Authorization": f"Bearer {token}"}))
        self.job_id, self.lease_id = self.leased_job()
        self.task_id = "trial-000"
        self.prefix = f"jobs/{self.job_id}/{self.task_id}/"
        self.ok(api.put(f"/v1alpha1/artifacts/{self.prefix}out.txt", content=b"out", headers=NODE))
        base = f"/v1alpha1/jobs/{self.job_id}/tasks/{self.task_id}/checkpoints"
        part = {"key": "rank0.pt", "sha256": "a" * 64, "size_bytes": 1}
        self.ok(api.post(f"{base}/parts", json={"attempt_id": self.lease_id, "step": 1, "part": part}, headers=NODE))
        self.ok(api.post(f"{base}/commit", json={"attempt_id": self.lease_id, "step": 1, "expected_parts": [part],
                                                 "storage_prefix": "ckpt/1/"}, headers=NODE))

    @staticmethod
    def ok(response: Any) -> Any:
        assert response.status_code < 300, (response.request.method, response.request.url, response.text)
        return response

    def job(self) -> str:
        return self.ok(self.api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=OWNER)).json()["job_id"]

    def leased_job(self) -> tuple[str, str]:
        job_id = self.job()
        lease = self.ok(self.api.post("/v1alpha1/leases/claim", json={"node_id": "node-a", "job_id": job_id},
                                      headers=NODE)).json()
        return job_id, lease["lease_id"]

    def checkpoint_part_call(self, base: str) -> Call:
        part = {"key": "rank0.pt", "sha256": "b" * 64, "size_bytes": 1}
        return Call(f"{base}/parts", json={"attempt_id": self.lease_id, "step": next(self.steps), "part": part})

    def commit_call(self, base: str) -> Call:
        step = next(self.steps)
        part = {"key": f"rank0-{step}.pt", "sha256": "c" * 64, "size_bytes": 1}
        self.ok(self.api.post(f"{base}/parts", json={"attempt_id": self.lease_id, "step": step, "part": part},
                              headers=OPERATOR))
        return Call(f"{base}/commit", json={"attempt_id": self.lease_id, "step": step, "expected_parts": [part],
                                            "storage_prefix": f"ckpt/{step}/"})

    def call_for(self, method: str, template: str) -> Call:
        """A request for the route whose success would show the credential passed: the
        objects it needs exist, and anything it uses up is made fresh for it."""
        job, task, lease = self.job_id, self.task_id, self.lease_id
        checkpoints = f"/v1alpha1/jobs/{job}/tasks/{task}/checkpoints"
        calls: dict[tuple[str, str], Callable[[], Call]] = {
            ("POST", "/v1alpha1/jobs"): lambda: Call("/v1alpha1/jobs", json=job_spec(trials=1)),
            ("POST", "/v1alpha1/jobs/{job_id}/cancel"): lambda: Call(f"/v1alpha1/jobs/{self.job()}/cancel"),
            ("POST", "/v1alpha1/nodes/register"): lambda: Call("/v1alpha1/nodes/register", json=registration("n")),
            ("POST", "/v1alpha1/nodes/{node_id}/heartbeat"): lambda: Call(
                "/v1alpha1/nodes/node-a/heartbeat", json={"node_id": "node-a"}),
            ("POST", "/v1alpha1/nodes/{node_id}/cordon"): lambda: Call(
                "/v1alpha1/nodes/node-b/cordon", json={"seconds": 60, "reason": "access test"}),
            ("DELETE", "/v1alpha1/nodes/{node_id}/cordon"): lambda: Call("/v1alpha1/nodes/node-b/cordon"),
            ("POST", "/v1alpha1/leases/claim"): lambda: Call(
                "/v1alpha1/leases/claim", json={"node_id": "node-a", "job_id": self.job()}),
            ("POST", "/v1alpha1/attempts/{lease_id}/heartbeat"): lambda: Call(f"/v1alpha1/attempts/{lease}/heartbeat"),
            ("GET", "/v1alpha1/attempts/{lease_id}/watch"): lambda: Call(f"/v1alpha1/attempts/{lease}/watch",
                                                                           params={"wait_s": 0}),
            ("POST", "/v1alpha1/attempts/{lease_id}/complete"): lambda: Call(
                f"/v1alpha1/attempts/{self.leased_job()[1]}/complete", json={"output_sha256": "0" * 64}),
            ("POST", "/v1alpha1/attempts/{lease_id}/fail"): lambda: Call(
                f"/v1alpha1/attempts/{self.leased_job()[1]}/fail", json={"reason": "access test"}),
            ("POST", "/v1alpha1/attempts/{lease_id}/release"): lambda: Call(
                f"/v1alpha1/attempts/{self.leased_job()[1]}/release", json={"reason": "access test"}),
            ("PUT", "/v1alpha1/artifacts/{key}"): lambda: Call(
                f"/v1alpha1/artifacts/{self.prefix}written.txt", content=b"w"),
            ("GET", "/v1alpha1/artifacts/{key}"): lambda: Call(f"/v1alpha1/artifacts/{self.prefix}out.txt"),
            ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/parts"): lambda: self.checkpoint_part_call(
                checkpoints),
            ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/commit"): lambda: self.commit_call(
                checkpoints),
            ("GET", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/lost-work"): lambda: Call(
                f"{checkpoints}/lost-work", params={"failed_at_step": 5}),
        }
        if (method, template) in calls:
            return calls[(method, template)]()
        return Call(template.format(job_id=job, task_id=task, lease_id=lease, node_id="node-a"))


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    settings = settings_for(tmp_path / "data", rate_limit_per_s=0.0,  # many calls from one token, by design
                            auth_failure_limit=0)  # and many refused tokens from one address
    with serve_in_thread(settings) as url, httpx.Client(base_url=url, timeout=30) as api:
        yield api, World(api)


def _routes_of(schema: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}


def test_every_route_answers_each_credential_as_documented(coordinator: tuple[Any, World]) -> None:
    api, world = coordinator
    schema = api.get("/openapi.json", headers=OPERATOR).json()
    routes = _routes_of(schema) | OUTSIDE_THE_SCHEMA
    assert routes - set(EXPECTED) == set(), "a route without a row in EXPECTED: decide who may call it"
    assert set(EXPECTED) - routes == set(), "a row in EXPECTED for a route the coordinator does not serve"

    wrong: list[str] = []
    for (method, template), outcomes in sorted(EXPECTED.items()):
        for (who, headers), expected in zip(CREDENTIALS.items(), outcomes):
            call = world.call_for(method, template)
            answer = api.request(method, call.path, json=call.json, content=call.content, params=call.params,
                                 headers=headers)
            allowed = expected if isinstance(expected, set) else {expected}
            if answer.status_code not in allowed:
                wrong.append(f"{method} {template} as {who}: {answer.status_code}, expected {expected}: "
                             f"{answer.text[:200]}")
    assert not wrong, "\n".join(wrong)


def test_a_submitter_lists_only_its_own_jobs_and_an_operator_all(coordinator: tuple[Any, World]) -> None:
    api, world = coordinator
    bobs = api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=CREDENTIALS["other_submitter"]).json()
    assert bobs["submitted_by"] == {"role": "submitter", "name": "bob"}
    mine = {job["job_id"] for job in api.get("/v1alpha1/jobs", headers=OWNER).json()}
    theirs = {job["job_id"] for job in api.get("/v1alpha1/jobs", headers=CREDENTIALS["other_submitter"]).json()}
    everything = {job["job_id"] for job in api.get("/v1alpha1/jobs", headers=OPERATOR).json()}
    assert world.job_id in mine and bobs["job_id"] not in mine
    assert theirs == {bobs["job_id"]}
    assert everything >= mine | theirs


@pytest.mark.parametrize(("key", "outcomes"), [
    # node, other node, owner, other submitter, operator, operator as node
    ("users/alice/data.csv", (403, 403, 200, 403, 200, 403)),
    ("users/bob/data.csv", (403, 403, 403, 200, 200, 403)),
    ("jobs/{job}/trial-000/result.txt", (200, 403, 200, 403, 200, 200)),
    ("jobs/{job}/round-000/weights.json", (403, 403, 200, 403, 200, 403)),
    ("elsewhere/file.txt", (403, 403, 403, 403, 200, 403)),
])
def test_write_scopes_of_each_role(coordinator: tuple[Any, World], key: str, outcomes: tuple[int, ...]) -> None:
    """A node writes under its live leases' task prefixes; a submitter under users/<name>/ and
    its own jobs; an operator anywhere."""
    api, world = coordinator
    key = key.format(job=world.job_id)
    who = ["node", "other_node", "owner", "other_submitter", "operator", "operator_as_node"]
    got = tuple(api.put(f"/v1alpha1/artifacts/{key}", content=b"x", headers=CREDENTIALS[w]).status_code for w in who)
    assert got == outcomes


def test_a_node_reads_the_inputs_of_its_live_leases_and_nothing_else(coordinator: tuple[Any, World]) -> None:
    api, _ = coordinator
    assert api.put("/v1alpha1/artifacts/users/alice/shard.csv", content=b"1,2\n", headers=OWNER).status_code == 200
    assert api.put("/v1alpha1/artifacts/users/alice/other.csv", content=b"3,4\n", headers=OWNER).status_code == 200
    spec = job_spec(trials=1)
    spec["spec"]["workload"]["parameters"]["inputs"] = {"data": "artifact://users/alice/shard.csv"}
    job_id = api.post("/v1alpha1/jobs", json=spec, headers=OWNER).json()["job_id"]
    before = api.get("/v1alpha1/artifacts/users/alice/shard.csv", headers=NODE)
    assert before.status_code == 403  # no lease yet
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a", "job_id": job_id}, headers=NODE).json()
    assert api.get("/v1alpha1/artifacts/users/alice/shard.csv", headers=NODE).content == b"1,2\n"
    assert api.get("/v1alpha1/artifacts/users/alice/other.csv", headers=NODE).status_code == 403
    assert api.get("/v1alpha1/artifacts/users/alice/shard.csv",
                   headers=CREDENTIALS["other_node"]).status_code == 403
    api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail", json={"reason": "done"}, headers=NODE)
    assert api.get("/v1alpha1/artifacts/users/alice/shard.csv", headers=NODE).status_code == 403  # lease over


def test_every_task_payload_says_who_submitted_the_job(coordinator: tuple[Any, World]) -> None:
    api, _ = coordinator
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=CREDENTIALS["other_submitter"]).json()[
        "job_id"]
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a", "job_id": job_id}, headers=NODE).json()
    assert lease["payload"]["submitted_by"] == {"role": "submitter", "name": "bob", "may_run_code": False}
    sha = hashlib.sha256(b"{}").hexdigest()
    assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json={"output_sha256": sha},
                    headers=NODE).json()["accepted"] is False  # nothing uploaded


def test_metrics_are_public_only_when_the_operator_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    with serve_in_thread(settings_for(tmp_path / "data", metrics_public=True)) as url:
        assert httpx.get(f"{url}/metrics").status_code == 200
        schema = httpx.get(f"{url}/openapi.json", headers=OPERATOR).json()
        assert schema["paths"]["/metrics"]["get"]["security"] == []
        assert httpx.get(f"{url}/v1alpha1/nodes").status_code == 401


def test_a_job_may_use_as_inputs_only_what_its_submitter_can_read(coordinator: tuple[Any, World]) -> None:
    """A node downloads its tasks' inputs: a submitter must not reach another's files through a job."""
    api, world = coordinator
    bob = CREDENTIALS["other_submitter"]
    assert api.put("/v1alpha1/artifacts/users/bob/secret.csv", content=b"1\n", headers=bob).status_code == 200
    spec = job_spec(trials=1)
    spec["spec"]["workload"]["parameters"]["inputs"] = {"data": "artifact://users/bob/secret.csv"}
    before = len(api.get("/v1alpha1/jobs", headers=OPERATOR).json())
    refused = api.post("/v1alpha1/jobs", json=spec, headers=OWNER)
    assert refused.status_code == 403 and "users/bob/secret.csv" in refused.json()["detail"]
    assert len(api.get("/v1alpha1/jobs", headers=OPERATOR).json()) == before  # nothing stored
    assert api.post("/v1alpha1/jobs", json=spec, headers=bob).status_code == 201  # bob's own file: fine
    spec["spec"]["workload"]["parameters"]["inputs"] = {"data": f"artifact://{world.prefix}out.txt"}
    assert api.post("/v1alpha1/jobs", json=spec, headers=OWNER).status_code == 201  # alice's own job's output
    assert api.post("/v1alpha1/jobs", json=spec, headers=OPERATOR).status_code == 201
