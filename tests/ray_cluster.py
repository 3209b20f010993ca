"""A real local Ray for the tests that need one: ``ray.init(num_cpus=2)`` in the test
process, once per test module, shut down at its end so that no Ray process idles through
the rest of the suite. A coordinator served in a thread of the test process
(``serve_in_thread``) and ``flash.submit(executor="ray")`` both find it connected and use
it; the Ray workers run beside the tests' own processes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

RAY_CPUS = 2


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """The ``ray`` module, connected to a local single-node Ray of ``RAY_CPUS`` CPUs."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
