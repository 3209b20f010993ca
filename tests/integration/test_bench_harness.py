"""``python -m benchmarks`` end to end: run a scenario, write bench_v1, render it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import targets
from tests._support import REPO_ROOT

pytestmark = pytest.mark.bench_smoke


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


def test_import_time_smoke_writes_a_result_file(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    run = _bench("run", "--scenario", "import_time", "--smoke", "--out", str(out))
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["schema"] == "bench_v1" and result["smoke"] is True
    assert set(result["host"]) >= {"os", "cpu", "cores", "ram_gb", "python", "torch", "numpy", "gpu",
                                   "flashruntime", "fs"}
    rows = {row["metric"]: row for row in result["rows"]}
    import_row = rows["import_ms"]
    assert import_row["status"] == "measured" and import_row["comparator"]["name"] == "import pydantic"
    assert import_row["target"] == targets.IMPORT_OVER_PYDANTIC.as_dict()
    assert import_row["ratio"] == pytest.approx(import_row["median"] / import_row["comparator"]["median"])
    assert rows["forbidden_modules_loaded"]["median"] == 0
    pace = import_row["host_pace_ms"]  # the host's pace around the scenario, on each of its rows
    assert pace["before"] and all(ms > 0 for ms in [*pace["before"].values(), *pace["after"].values()])
    assert result["host_pace_workload"]
    assert all(row["host_pace_ms"] == pace for row in result["rows"])
    assert "smoke run — not representative" in run.stdout

    report = _bench("report", str(out))
    assert report.returncode == 0 and "| import_time | import_ms |" in report.stdout
    assert "- import_time: host pace (reference workload, ms per CPU) before: " in report.stdout


def test_unknown_scenario_is_refused(tmp_path: Path) -> None:
    run = _bench("run", "--scenario", "no_such_scenario", "--smoke", "--out", str(tmp_path / "x.json"))
    assert run.returncode == 2 and "unknown scenario" in run.stderr
    assert not (tmp_path / "x.json").exists()


def test_list_names_the_registered_scenarios() -> None:
    listing = _bench("list")
    assert listing.returncode == 0 and "import_time" in listing.stdout
