"""Signals from a finished local process: its exit code and the tail of
its log decide only whether the failure would recur on retry.

Pure. Only ``exit_code`` and ``exit_deterministic`` are ever set; the log text is
not copied into ``message``, so it can never trigger the comm/storage markers.
"""

from __future__ import annotations

import re
import signal

from flashruntime.recovery.taxonomy import FailureSignals

__all__ = ["DETERMINISTIC_EXCEPTIONS", "describe_launch", "from_local_launch"]

DETERMINISTIC_EXCEPTIONS = (
    "SyntaxError",
    "IndentationError",
    "ImportError",
    "ModuleNotFoundError",
    "NameError",
    "AttributeError",
)

TRACEBACK_HEADER = "Traceback (most recent call last):"
TORCHRUN_WRAPPER = "ChildFailedError"

# A line (after any leading "[rank3]:" / "[default0]:" tags) that starts with a
# deterministic exception name, optionally module-qualified, then ":" or end of line.
# The name may come several times in a row: ranks of one torchrun job write the same
# traceback to one stream at once, which interleaves them ("ModuleNotFoundErrorModule
# NotFoundError: : No module named ...").
_DETERMINISTIC_LINE = re.compile(
    r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)*"
    r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*"
    r"(" + "|".join(DETERMINISTIC_EXCEPTIONS) + r")(?:\1)*"
    r"(?::|$)",
    re.MULTILINE,
)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _verdict(exit_code: int | None, log_tail: str | None) -> tuple[bool, str]:
    """(deterministic, a few words naming the evidence)."""
    if exit_code is None:
        return False, "no exit code"
    if exit_code == 0:
        return False, "exit 0"
    text = "\n".join((log_tail or "").splitlines())
    match = _DETERMINISTIC_LINE.search(text)
    if match:
        return True, f"{match.group(1)} at line start"
    wrapped = TORCHRUN_WRAPPER in text
    if TRACEBACK_HEADER in text and not wrapped:
        return True, "traceback without ChildFailedError"
    if exit_code < 0:
        return False, f"killed by {_signal_name(-exit_code)}"
    if wrapped:
        return False, "torchrun ChildFailedError"
    if 128 < exit_code < 128 + 65:
        return False, f"exit {exit_code} (128 + {_signal_name(exit_code - 128)})"
    return False, f"exit {exit_code} without a traceback"


def from_local_launch(exit_code: int | None, log_tail: str | None) -> FailureSignals:
    """Signals of a finished local process: deterministic iff a line starts with one
    of ``DETERMINISTIC_EXCEPTIONS`` (after ``[rankN]:``-style tags), or a traceback
    appears without torchrun's ``ChildFailedError`` wrapper; transient otherwise."""
    deterministic, _ = _verdict(exit_code, log_tail)
    return FailureSignals(exit_code=exit_code, exit_deterministic=deterministic)


def describe_launch(exit_code: int | None, log_tail: str | None) -> str:
    """A few words naming the evidence behind ``from_local_launch`` for the same
    arguments, e.g. ``"ModuleNotFoundError at line start"``, ``"killed by SIGKILL"``."""
    return _verdict(exit_code, log_tail)[1]
