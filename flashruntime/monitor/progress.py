"""Step and loss of a running attempt from its output, for a script that logs no
``metrics.jsonl``: the last line that says them, as the common frameworks print them —
a JSON object or a Python dict (the Hugging Face Trainer's ``{'loss': 2.31, ..., 'epoch':
0.5}``), or a progress bar (``12/40 [00:03<00:07, loss=0.231]``, Lightning's and tqdm's).
Pure.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

__all__ = ["FRAMEWORK_METRICS_NAME", "OutputProgress", "progress_from_output"]

# Where the runtime writes the step and loss it read in a script's output, beside the attempt's
# own files, for the run page's curves (never metrics.jsonl: that is the script's own).
FRAMEWORK_METRICS_NAME = "framework-metrics.jsonl"

_TAGS = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)+")
_BAR = re.compile(r"(?P<done>[0-9]+)/(?P<total>[0-9]+) \[")
_BAR_LOSS = re.compile(r"\b(?:train_)?loss(?:_step)?=(?P<loss>[-+0-9.eE]+)")
_STEP_KEYS = ("step", "global_step", "steps")
_MAX_LINES = 200


def _number(value: Any) -> float | None:
    """A finite number, also as the text of one (the Hugging Face Trainer prints ``'loss': '4.708'``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _mapping(text: str) -> dict[str, Any] | None:
    if not (text.startswith("{") and text.endswith("}")) or len(text) > 4096:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)  # literals only: nothing of the line runs
        except Exception:  # noqa: BLE001 - "{[]: 1}" is a TypeError: whatever it is, no figures
            return None
    return value if isinstance(value, dict) else None


_DICT = re.compile(r"\{[^{}]*\}")


def _from_mapping(record: dict[str, Any], found: dict[str, Any]) -> None:
    loss = _number(record.get("loss"))
    if loss is None:
        return
    found.setdefault("loss", loss)
    step = next((record[k] for k in _STEP_KEYS if isinstance(record.get(k), int)), None)
    if step is not None:
        found.setdefault("step", step)
    elif "step" not in found and _number(record.get("epoch")) is not None:
        found.setdefault("epoch", record["epoch"])


def _from_bar(segment: str, found: dict[str, Any]) -> None:
    bar = _BAR.search(_DICT.sub("", segment))
    if bar is None:
        return
    found.setdefault("step", int(bar.group("done")))
    loss = _BAR_LOSS.search(segment)
    if loss is not None:
        try:
            found.setdefault("loss", float(loss.group("loss")))
        except ValueError:
            pass


def progress_from_output(text: str) -> dict[str, Any]:
    """``{"step": ..., "loss": ...}`` (either may be missing; ``epoch`` stands in for the step
    where only it is said) from the last lines of ``text`` that report them; ``{}`` when none does."""
    found: dict[str, Any] = {}
    for line in reversed(text.splitlines()[-_MAX_LINES:]):
        for segment in reversed(_TAGS.sub("", line).split("\r")):
            for literal in reversed(_DICT.findall(segment)):
                record = _mapping(literal)
                if record is not None:
                    _from_mapping(record, found)
            _from_bar(segment, found)
            if "loss" in found and "step" in found:
                return found
    return found


class OutputProgress:
    """Reads a growing output line by line and yields a ``{"step", "loss"}`` record each time a
    line reports a loss (the step from the same line, else the last training progress bar's:
    a bar counting less than the step reached is some other bar), for the run page's curves of
    a script that logs no ``metrics.jsonl``."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._losses = 0

    def feed(self, lines: list[str]) -> list[dict[str, Any]]:
        records = []
        for line in lines:
            for segment in _TAGS.sub("", line).split("\r"):
                found: dict[str, Any] = {}
                for literal in _DICT.findall(segment):
                    record = _mapping(literal)
                    if record is not None:
                        _from_mapping(record, found)
                bar: dict[str, Any] = {}
                _from_bar(segment, bar)
                # Training only moves forward: a smaller count is another bar (evaluation, a save's
                # "Writing model shards 1/1"), never the training step.
                if "step" in bar and (self._step is None or bar["step"] >= self._step):
                    found.setdefault("step", bar["step"])
                    if "loss" in bar:
                        found.setdefault("loss", bar["loss"])
                if "step" in found and "loss" not in found:
                    self._step = int(found["step"])
                if "loss" in found:
                    self._losses += 1
                    step = found.get("step", self._step if self._step is not None else self._losses)
                    self._step = int(step)
                    records.append({"step": int(step), "loss": float(found["loss"])})
        return records
