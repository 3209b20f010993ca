"""The failure summary of a local run: which attempt failed, how the recovery policy
classified it and what it decided, the lines of its log that show the error, and where
the whole log is. Pure: built from the run's attempt rows, events and sweep table."""

from __future__ import annotations

import re
from typing import Any

from flashruntime.recovery.budget import RestartBudget

__all__ = ["MAX_TRIALS_SHOWN", "render_failure_summary"]

MAX_TRIALS_SHOWN = 5  # a sweep's failed trials shown in full; the rest are counted
_LABEL = 10
# What a bare signal most often means, for the evidence that names it.
_HINTS = {
    "killed by SIGKILL": "a SIGKILL is most often the kernel's out-of-memory killer (see `dmesg`), or a kill -9",
    "exit 137 (128 + SIGKILL)": "a SIGKILL is most often the kernel's out-of-memory killer (see `dmesg`), or a kill -9",
}


def _line(label: str, text: str) -> str:
    return f"  {label.ljust(_LABEL)}{text}"


def _rank(tag: str) -> str:
    """``[default1]:`` (torchrun --tee: role, local rank) or ``[rank3]:`` (global rank), in words."""
    match = re.match(r"\[([A-Za-z]+)([0-9]+)\]:", tag)
    if match is None:
        return tag
    role, number = match.groups()
    return f"rank {number} {tag}" if role == "rank" else f"local rank {number} {tag}"


def _attempt_block(row: dict[str, Any], attempt_number: int, attempts: int, budget: RestartBudget) -> list[str]:
    failure = row.get("failure") or {}
    exit_code = row.get("exit_code")
    lines = [_line("attempt", f"{row['attempt_id']} ({attempt_number} of {attempts}), exit {exit_code}")]
    if failure:
        lines.append(_line("failure", f"{failure['class']} ({failure['evidence']})"))
        lines.append(_line("decision", budget.words(failure["action"], failure["reason"],
                                                    spent=bool(failure.get("restarts_spent")))))
        if failure.get("exception"):
            lines.append(_line("error", failure["exception"]))
            lines += [" " * (_LABEL + 2) + frame for frame in failure.get("traceback") or []]
        elif failure.get("last_lines"):
            lines.append(_line("output", failure["last_lines"][0]))  # its last lines
            lines += [" " * (_LABEL + 2) + line for line in failure["last_lines"][1:]]
        if failure.get("rank"):
            lines.append(_line("rank", _rank(failure["rank"])))
        if isinstance(failure.get("hang"), dict) and failure["hang"].get("stacks"):
            lines.append(_line("stacks", failure["hang"]["stacks"]))
        hint = _HINTS.get(failure.get("evidence", ""))
        if hint:
            lines.append(_line("hint", hint))
    log = row.get("output_dir")
    if log:
        lines.append(_line("log", f"{log}/launcher.log"))
    return lines


def _job_block(job_id: str, attempts: list[dict[str, Any]], budget: RestartBudget) -> list[str]:
    rows = [row for row in attempts if row.get("job_id") == job_id]
    failed = [row for row in rows if row.get("state") == "FAILED"]
    if not failed:
        return []
    last = failed[-1]
    return _attempt_block(last, rows.index(last) + 1, len(rows), budget)


def _launch_failure(events: list[dict[str, Any]]) -> list[str]:
    message = next((e["message"] for e in reversed(events) if e.get("type") == "LAUNCH_FAILED"), None)
    if message is None:
        return []
    return [
        _line("failure", "application_error (the command could not start)"),
        _line("decision", "fail_job — a relaunch would fail the same way"),
        _line("error", message),
    ]


def _params(params: Any) -> str:
    if isinstance(params, dict):
        return ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                         for key, value in params.items())
    return str(params)


def render_failure_summary(
    attempts: list[dict[str, Any]], events: list[dict[str, Any]], sweep: dict[str, Any] | None, budget: RestartBudget
) -> str:
    """The summary of a run that ended FAILED (see ``Run.failure_summary``)."""
    if sweep is None:
        lines = ["Run FAILED."]
        block = _job_block("local", attempts, budget)
        lines += block or _launch_failure(events) or ["  no attempt failed; see the run's events"]
        return "\n".join(lines)
    trials = sweep.get("trials") or []
    failed = [trial for trial in trials if trial.get("state") == "FAILED"]
    lines = [f"Run FAILED: {len(failed)} of {len(trials)} trials failed."]
    for trial in failed[:MAX_TRIALS_SHOWN]:
        lines.append(f"trial {trial['trial_id']} ({_params(trial.get('params'))})")
        lines += _job_block(trial["trial_id"], attempts, budget) or _launch_failure(events)
    if len(failed) > MAX_TRIALS_SHOWN:
        lines.append(f"... and {len(failed) - MAX_TRIALS_SHOWN} more failed trials: see run.json")
    if not failed:
        lines += _launch_failure(events) or ["  no trial failed; see the run's events"]
    return "\n".join(lines)
