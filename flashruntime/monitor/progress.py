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

__all__ = ["progress_from_output"]

_TAGS = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)+")
_BAR = re.compile(r"(?P<done>[0-9]+)/(?P<total>[0-9]+) \[")
_BAR_LOSS = re.compile(r"\b(?:train_)?loss(?:_step)?=(?P<loss>[-+0-9.eE]+)")
_STEP_KEYS = ("step", "global_step", "steps")
_MAX_LINES = 200


def _number(value: Any) -> float | None:
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
        except (ValueError, SyntaxError, MemoryError, RecursionError):
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
