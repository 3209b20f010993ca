"""Property-based fuzzing of the live coordinator from its own OpenAPI schema.

Schemathesis generates requests for every operation, valid ones and invalid ones, sent
to a real uvicorn on 127.0.0.1 with each role's token; path parameters are random, or
the ids of a real job, task, lease and node so the handlers behind the checks run too.
Every answer must be below 500 and match the schema the coordinator publishes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.slow]
httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

TOKENS = {
    "FLASHML_NODE_TOKENS": "node-a:tok-node-a",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
    "FLASHML_ARGV_SUBMITTERS": "alice",
}
ROLES = {"node": "tok-node-a", "submitter": "tok-alice", "operator": "tok-root"}
EXAMPLES_PER_OPERATION = 12  # per role, mode and kind of path parameter: bounded for the suite's time


@contextlib.contextmanager
def seeded_coordinator(data_dir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A coordinator with tokens, a registered node, one of alice's jobs with a leased task:
    its URL and the ids a request can name. The limits on request rates and on failed
    authentications are off: a fuzzer sends many requests, wrong credentials among them,
    from one address."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in TOKENS.items():
            patch.setenv(name, value)
        settings = settings_for(data_dir, rate_limit_per_s=0.0, auth_failure_limit=0)
        with serve_in_thread(settings) as url:
            node = {"Authorization": "Bearer tok-node-a"}
            httpx.post(f"{url}/v1alpha1/nodes/register", json=registration(), headers=node).raise_for_status()
            job = httpx.post(f"{url}/v1alpha1/jobs", json=job_spec(trials=3),
                             headers={"Authorization": "Bearer tok-alice"}).json()
            lease = httpx.post(f"{url}/v1alpha1/leases/claim", json={"node_id": "node-a"}, headers=node).json()
            key = f"jobs/{job['job_id']}/{lease['task_id']}/metrics.json"
            httpx.put(f"{url}/v1alpha1/artifacts/{key}", content=b"{}", headers=node).raise_for_status()
            real = {"job_id": job["job_id"], "task_id": lease["task_id"], "lease_id": lease["lease_id"],
                    "node_id": "node-a", "key": key}
            yield url, real


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    with seeded_coordinator(tmp_path_factory.mktemp("fuzz") / "data") as seeded:
        yield seeded


def _fuzz(strategy: Any, url: str, headers: dict[str, str], label: str, failures: list[str]) -> int:
    """Send up to ``EXAMPLES_PER_OPERATION`` cases drawn from ``strategy``; each answer that is
    a server error or off its schema is added to ``failures``. → the number of calls made."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import response_schema_conformance

    calls = 0

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Any) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=url, headers=headers, timeout=30)
        try:
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
        except (AssertionError, FailureGroup) as exc:  # collected, so one run reports every failure
            failures.append(f"{label} -> {response.status_code}: {str(exc)[:400]}")

    check()
    return calls


@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_server_error_and_every_answer_matches_the_schema(live: tuple[str, dict[str, str]], role: str) -> None:
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    url, real = live
    headers = {"Authorization": f"Bearer {ROLES[role]}"}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers)
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        names = {parameter.name for parameter in operation.path_parameters}
        fixed = {name: value for name, value in real.items() if name in names}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for path_parameters in ([None, fixed] if fixed else [None]):
                strategy = operation.as_strategy(mode, path_parameters=path_parameters)
                try:
                    calls += _fuzz(strategy, url, headers, f"{operation.label} [{mode.value}]", failures)
                except Unsatisfiable:  # nothing invalid can be made of it (no parameters, no body)
                    assert mode is GenerationMode.NEGATIVE
    assert calls > 100
    assert not failures, "\n\n".join(failures[:20])


def test_the_schema_declares_bearer_security_and_each_operations_roles(live: tuple[str, dict[str, str]]) -> None:
    url, _ = live
    schema = httpx.get(f"{url}/openapi.json", headers={"Authorization": "Bearer tok-node-a"}).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "a node, submitter or operator token (open mode: none "
                                                            "needed)"}
    submit = schema["paths"]["/v1alpha1/jobs"]["post"]
    assert submit["security"] == [{"bearer": []}] and submit["x-flashml-roles"] == ["operator", "submitter"]
    assert schema["paths"]["/healthz"]["get"]["security"] == []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert "200" in operation["responses"] or "201" in operation["responses"], (method, path)
            assert "4XX" in operation["responses"], (method, path)
    assert httpx.get(f"{url}/openapi.json").status_code == 401  # only for a token holder
