"""``flashruntime demo`` end to end with only the core importable.

Timing is the ``demo_wall`` benchmark's business; this test carries only a hang guard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._support import run_core_only

HANG_GUARD_S = 120


def _demo(*args: str) -> tuple[int, dict]:
    result = run_core_only(
        "from flashruntime.cli.dispatch import main\n"
        f"raise SystemExit(main(['demo', '--json', *{list(args)!r}]))\n",
        timeout=HANG_GUARD_S,
    )
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_demo_crashes_recovers_and_resumes(tmp_path: Path) -> None:
    code, report = _demo("--output-dir", str(tmp_path))
    assert code == 0 and report["ok"] is True and report["state"] == "SUCCEEDED"
    by_type: dict[str, list[str]] = {}
    for event in report["events"]:
        by_type.setdefault(event["type"], []).append(event["message"])
    assert by_type["FAILURE_CLASSIFIED"] == ["task-000: worker_crash (exit -9; killed by SIGKILL)"]
    assert by_type["RECOVERY_ACTION_SELECTED"][0].startswith("task-000: restart_group — ")
    assert len(by_type["RESUME_SELECTED"]) == 1
    assert by_type["RESUME_SELECTED"][0].startswith("task-000-r1 resumes from step 20 (ck-")
    trial = report["trial"]
    assert trial["started_from_step"] == 20 and trial["resumed"] is True and trial["steps"] == 60


def test_demo_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    _, crashed = _demo("--output-dir", str(tmp_path / "crashed"))
    code, clean = _demo("--output-dir", str(tmp_path / "clean"), "--no-crash")
    assert code == 0 and clean["trial"]["started_from_step"] == 0
    assert not any(e["type"] == "FAILURE_CLASSIFIED" for e in clean["events"])
    # Deterministic batches: the resumed run lands on exactly the same weights.
    assert crashed["trial"]["weights"] == clean["trial"]["weights"]
    assert crashed["trial"]["final_loss"] == pytest.approx(clean["trial"]["final_loss"], abs=1e-12)


def test_demo_human_output(tmp_path: Path) -> None:
    result = run_core_only(
        "from flashruntime.cli.dispatch import main\n"
        f"raise SystemExit(main(['demo', '--output-dir', {str(tmp_path)!r}]))\n",
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr
    for needle in ("FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED", "RESUME_SELECTED", "state: SUCCEEDED",
                   f"output: {tmp_path}"):
        assert needle in result.stdout


def test_demo_ddp_without_torch_says_how_to_get_it(tmp_path: Path) -> None:
    result = run_core_only(
        "from flashruntime.cli.dispatch import main\n"
        f"raise SystemExit(main(['demo', '--ddp', '--output-dir', {str(tmp_path)!r}]))\n",
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 1 and "--ddp needs PyTorch: pip install torch" in result.stderr


def test_demo_refuses_a_directory_that_already_holds_a_run(tmp_path: Path) -> None:
    """A second demo into the same directory would resume from the first one's checkpoints:
    no crash, no recovery, and a confusing FAILED. It is refused before anything runs."""
    code, _ = _demo("--output-dir", str(tmp_path), "--no-crash")
    assert code == 0
    before = sorted(path.name for path in tmp_path.rglob("*"))
    result = run_core_only(
        "from flashruntime.cli.dispatch import main\n"
        f"raise SystemExit(main(['demo', '--output-dir', {str(tmp_path)!r}]))\n",
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert f"{tmp_path} already holds a run (run.json)" in result.stderr
    assert "pass a new --output-dir, or none for a new one" in result.stderr
    assert sorted(path.name for path in tmp_path.rglob("*")) == before  # nothing launched, nothing moved aside
