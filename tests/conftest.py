"""Suite-wide rules: tiers are directories, markers say what a test needs.

Under ``CI=true`` a skip is a failure (CI must not go green by skipping), except a
``gpu`` test skipping for lack of CUDA.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.postgres_server import postgres_cluster, postgres_url  # noqa: F401  (fixtures for every tier)
from tests.ray_cluster import ray_cluster  # noqa: F401  (a fixture for every tier)

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the benchmarks package lives beside the library


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if not _in_ci() or not report.skipped:
        return
    if item.get_closest_marker("gpu") is not None:
        return  # the one skip CI accepts: no CUDA here
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"


@pytest.fixture(autouse=True, scope="session")
def _runs_dir_of_the_suite(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs started without an output directory go to the user's data directory, and a
    coordinator without settings to ``/data``: the suite keeps both in temporary
    directories instead (its subprocesses inherit them)."""
    if not os.environ.get("FLASHML_RUNS_DIR"):
        os.environ["FLASHML_RUNS_DIR"] = str(tmp_path_factory.mktemp("runs"))
    # A coordinator built from defaults (an import of the app module) would write to /data.
    if not os.environ.get("FLASHML_LEDGER_PATH"):
        data = tmp_path_factory.mktemp("coordinator-data")
        os.environ["FLASHML_LEDGER_PATH"] = str(data / "flashruntime.db")
        os.environ.setdefault("FLASHML_LOCAL_ARTIFACTS_DIR", str(data / "artifacts"))
