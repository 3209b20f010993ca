"""The coordinator's OpenAPI schema says what it accepts and answers: schemathesis, with
every check it has, against a live coordinator on 127.0.0.1.

Besides "no server error" and "the answer matches its schema" (which the fuzz test runs
at length), this runs the checks that compare the server with its schema both ways:
declared status codes, content types and headers, valid data accepted and invalid data
refused, unsupported methods answered 405 with ``Allow``, missing or wrong credentials
refused, and no object reachable after it is gone or by another caller. Examples per
operation stay few: the point is that every check has a say on every operation. The
settings are the repository's ``schemathesis.toml``, as a command-line run would read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests._support import REPO_ROOT
from tests.integration.test_coordinator_fuzz import seeded_coordinator

pytestmark = [pytest.mark.service, pytest.mark.slow]
schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES_PER_OPERATION = 10  # per mode and kind of path parameter


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    with seeded_coordinator(tmp_path_factory.mktemp("schema") / "data") as seeded:
        yield seeded


def _run_all_checks(strategy: Any, url: str, label: str, failures: list[str]) -> int:
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import CHECKS, load_all_checks
    from schemathesis.core.failures import FailureGroup

    load_all_checks()
    every_check = CHECKS.get_all()
    calls = 0

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Any) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=url, timeout=30)
        try:
            case.validate_response(response, checks=every_check, transport_kwargs={"base_url": url, "timeout": 30})
        except (AssertionError, FailureGroup) as exc:
            failures.append(f"{label} -> {response.status_code} ({response.request.url}): {str(exc)[:600]}")

    check()
    return calls


def test_every_schemathesis_check_passes_on_every_operation(live: tuple[str, dict[str, str]]) -> None:
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    url, real = live
    from schemathesis.config import SchemathesisConfig

    # The operator's token, which may call every route, as the schema's bearer scheme: a
    # negative case may leave it out or spoil it, and the answer must then be a refusal.
    settings = (REPO_ROOT / "schemathesis.toml").read_text() + '\n[auth.openapi.bearer]\nbearer = "tok-root"\n'
    config = SchemathesisConfig.from_str(settings)
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers={"Authorization": "Bearer tok-root"},
                                           config=config)
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
                    calls += _run_all_checks(strategy, url, f"{operation.label} [{mode.value}]", failures)
                except Unsatisfiable:  # nothing invalid can be made of it (no parameters, no body)
                    assert mode is GenerationMode.NEGATIVE
    assert calls > 50
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:25])
