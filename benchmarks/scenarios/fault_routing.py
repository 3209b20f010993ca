"""fault_routing: five injected faults through flash.submit, each expected to end in
one typed outcome (final state, failure class, action, resume point)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import faults_routed

NAME, SECTION = "fault_routing", "resilience"
STEPS, EVERY = 40, 10


def _submit(script: Path, out: Path, *, max_restarts: int, wait: bool = True, env: dict[str, str] | None = None):
    import sys

    from flashruntime.sdk import submit
    from flashruntime.workloads.command import CommandWorkload

    workload = CommandWorkload(command=[sys.executable, str(script)], env=env or {})
    return submit(workload, output_dir=out, max_restarts=max_restarts, wait=wait, watch=False)


def _messages(run: Any, kind: str) -> list[str]:
    return [e["message"] for e in run.events if e["type"] == kind]


def _final_metrics(run: Any) -> dict[str, Any]:
    return run.trials[-1] if run.trials else {}


def _import_error(work: Path) -> tuple[bool, str]:
    from benchmarks.faults import write_crashy_trainer

    run = _submit(write_crashy_trainer(work / "src", STEPS, EVERY, "import_error"), work / "out", max_restarts=2)
    ok = (str(run.state) == "FAILED" and len(run.attempts) == 1
          and _messages(run, "FAILURE_CLASSIFIED")[0].startswith("task-000: application_error")
          and "fail_job" in _messages(run, "RECOVERY_ACTION_SELECTED")[0])
    return ok, f"{run.state}, {len(run.attempts)} attempt(s), {_messages(run, 'FAILURE_CLASSIFIED')}"


def _systemexit_mid(work: Path) -> tuple[bool, str]:
    from benchmarks.faults import write_crashy_trainer

    run = _submit(write_crashy_trainer(work / "src", STEPS, EVERY, "systemexit_mid"), work / "out", max_restarts=1)
    metrics = _final_metrics(run)
    ok = (str(run.state) == "SUCCEEDED" and _messages(run, "FAILURE_CLASSIFIED")[0].startswith("task-000: worker_crash")
          and metrics.get("started_from_step") == 20)
    return ok, f"{run.state}, resumed from {metrics.get('started_from_step')}"


def _external_sigkill(work: Path) -> tuple[bool, str]:
    from benchmarks.faults import kill_child, write_crashy_trainer

    script = write_crashy_trainer(work / "src", STEPS, EVERY, None)
    run = _submit(script, work / "out", max_restarts=1, wait=False, env={"CRASHY_STEP_SECONDS": "0.05"})

    def after_first_checkpoint(row: dict[str, Any]) -> bool:
        return (Path(row["output_dir"]).parent / "ckpt" / "step-000010" / "manifest.json").exists()

    killed = kill_child(run, after_first_checkpoint, timeout_s=60)
    run.wait(120)
    metrics = _final_metrics(run)
    ok = (killed and str(run.state) == "SUCCEEDED" and metrics.get("started_from_step", 0) >= 10
          and _messages(run, "FAILURE_CLASSIFIED")[0].startswith("task-000: worker_crash"))
    return ok, f"killed={killed}, {run.state}, resumed from {metrics.get('started_from_step')}"


def _sigkill_in_write_window(work: Path) -> tuple[bool, str]:
    from benchmarks.faults import kill_child, write_crashy_trainer

    script = write_crashy_trainer(work / "src", STEPS, EVERY, None)
    run = _submit(script, work / "out", max_restarts=1, wait=False,
                  env={"CRASHY_WRITE_WINDOW_SECONDS": "0.5", "CRASHY_STEP_SECONDS": "0.01"})

    def in_second_write_window(row: dict[str, Any]) -> bool:
        marker = Path(row["output_dir"]) / "in_write_window"
        try:
            return marker.read_text() == "20"
        except OSError:
            return False

    killed = kill_child(run, in_second_write_window, timeout_s=60)
    run.wait(120)
    metrics = _final_metrics(run)
    resume = _messages(run, "RESUME_SELECTED")
    # The torn step 20 has parts but no manifest: the resume must pick step 10.
    ok = killed and str(run.state) == "SUCCEEDED" and metrics.get("started_from_step") == 10
    return ok, f"killed={killed}, {run.state}, {resume}"


def _corrupted_newest_part(work: Path) -> tuple[bool, str]:
    from benchmarks.faults import corrupt_newest_part, write_crashy_trainer

    first = _submit(write_crashy_trainer(work / "src", STEPS, EVERY, "systemexit_mid"), work / "out", max_restarts=0)
    corrupted = corrupt_newest_part(work / "out" / "local" / "ckpt")
    second = _submit(write_crashy_trainer(work / "src", STEPS, EVERY, None), work / "out", max_restarts=0)
    metrics = _final_metrics(second)
    ok = (str(first.state) == "FAILED" and corrupted is not None and str(second.state) == "SUCCEEDED"
          and metrics.get("started_from_step") == 10)
    return ok, f"corrupted {corrupted and corrupted.parent.name}, second run started from {metrics.get('started_from_step')}"


FAULTS = {
    "import_error": _import_error,
    "systemexit_mid": _systemexit_mid,
    "external_sigkill": _external_sigkill,
    "sigkill_in_write_window": _sigkill_in_write_window,
    "corrupted_newest_part": _corrupted_newest_part,
}


def run(repeats: int, smoke: bool) -> list[dict]:
    rounds = 1 if smoke else max(3, repeats)
    correct_per_round: list[float] = []
    notes: list[str] = []
    base = Path(__file__).resolve().parents[1] / ".work"
    base.mkdir(exist_ok=True)
    for round_index in range(rounds):
        correct = 0
        for name, fault in FAULTS.items():
            with tempfile.TemporaryDirectory(dir=base) as tmp:
                started = time.perf_counter()
                ok, detail = fault(Path(tmp))
                correct += ok
                if round_index == 0 or not ok:
                    notes.append(f"round {round_index}: {name}: {'ok' if ok else 'WRONG'} ({detail}; "
                                 f"{time.perf_counter() - started:.1f} s)")
        correct_per_round.append(float(correct))
    return [measured_row(NAME, SECTION, "typed_outcomes_correct", f"of {len(FAULTS)}", correct_per_round,
                         target=faults_routed(len(FAULTS)), notes=notes)]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="every injected fault ends in its typed outcome: fail fast on bugs, resume from the last valid step",
    section=SECTION,
    run=run,
)
