"""Signals from a finished local process: its exit code and the tail of
its log decide only whether the failure would recur on retry.

Pure. Only ``exit_code`` and ``exit_deterministic`` are ever set; the log text is
not copied into ``message``, so it can never trigger the comm/storage markers.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import NamedTuple

from flashruntime.recovery.taxonomy import FailureSignals

__all__ = [
    "DETERMINISTIC_EXCEPTIONS",
    "LAUNCH_ERRORS",
    "LAUNCH_ERROR_EXIT_CODES",
    "LaunchErrorRule",
    "LogExcerpt",
    "describe_launch",
    "failure_excerpt",
    "from_local_launch",
]

DETERMINISTIC_EXCEPTIONS = (
    "SyntaxError",
    "IndentationError",
    "ImportError",
    "ModuleNotFoundError",
    "NameError",
    "AttributeError",
)

class LaunchErrorRule(NamedTuple):
    """A log line showing the command could not start: named by ``words``, matched by
    ``pattern`` (after any rank tags), as in ``example``."""

    words: str
    pattern: str
    example: str


# A command that could not start at all fails the same way every time.
LAUNCH_ERRORS: tuple[LaunchErrorRule, ...] = (
    LaunchErrorRule("python could not open the script", r"^\S*: can't open file .*$",
                    "/usr/bin/python3: can't open file '/w/trian.py': [Errno 2] No such file or directory"),
    LaunchErrorRule("python -m found no such module",
                    r"^\S*python\S*: (?:No module named \S+|Error while finding module specification for .*)$",
                    "/usr/bin/python3: No module named trainer"),
    LaunchErrorRule("the shell could not run the command",
                    r"^(?:\S*/)?(?:ba|da|z|k|c|tc|fi)?sh(?:: line [0-9]+|: [0-9]+)?: .+: "
                    r"(?:command not found|not found|No such file or directory|Permission denied)$",
                    "bash: trian.sh: command not found"),
    LaunchErrorRule("the command does not exist",
                    r"^(?:\S*/)?(?:env|exec|nohup|timeout|xargs|nice): .+: No such file or directory$",
                    "env: 'trian': No such file or directory"),
)
# What a shell (and POSIX exec wrappers) exit with when the command cannot be run.
LAUNCH_ERROR_EXIT_CODES: dict[int, str] = {126: "found but not executable", 127: "command not found"}

TRACEBACK_HEADER = "Traceback (most recent call last):"
TORCHRUN_WRAPPER = "ChildFailedError"

# Leading torchrun tags, stacked: "[default0]:" (--tee) or "[rank3]: " (torch's own).
_TAGS = re.compile(r"^((?:\[[A-Za-z]+[0-9]+\]:)+)")
_TAGGED_LAUNCH_ERRORS = tuple(
    (rule.words, re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)*" + rule.pattern.lstrip("^"), re.MULTILINE))
    for rule in LAUNCH_ERRORS
)

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
    for words, pattern in _TAGGED_LAUNCH_ERRORS:
        if pattern.search(text):
            return True, f"{words}: exit {exit_code}"
    if exit_code in LAUNCH_ERROR_EXIT_CODES:
        return True, f"exit {exit_code} ({LAUNCH_ERROR_EXIT_CODES[exit_code]})"
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
    """Signals of a finished local process. Deterministic iff, in this order: a line
    starts with one of ``DETERMINISTIC_EXCEPTIONS`` (after ``[rankN]:``-style tags); a
    line shows the command could not start (``LAUNCH_ERRORS``); the exit code is one a
    shell gives a command it cannot run (``LAUNCH_ERROR_EXIT_CODES``); or a traceback
    appears without torchrun's ``ChildFailedError`` wrapper. Transient otherwise."""
    deterministic, _ = _verdict(exit_code, log_tail)
    return FailureSignals(exit_code=exit_code, exit_deterministic=deterministic)


def describe_launch(exit_code: int | None, log_tail: str | None) -> str:
    """A few words naming the evidence behind ``from_local_launch`` for the same
    arguments, e.g. ``"ModuleNotFoundError at line start"``, ``"killed by SIGKILL"``."""
    return _verdict(exit_code, log_tail)[1]


@dataclass(frozen=True)
class LogExcerpt:
    """The lines of a failed attempt's log that say what went wrong."""

    exception: str | None  # "ModuleNotFoundError: No module named 'x'", or a launch error's line
    traceback: tuple[str, ...]  # the last lines of the traceback that ends in ``exception``
    tag: str | None  # the rank tag those lines carried ("[default1]:"), if any


_EXCERPT_FRAMES = 6  # traceback lines kept above the exception line


def _untag(line: str) -> tuple[str | None, str]:
    match = _TAGS.match(line)
    if match is None:
        return None, line
    return match.group(1), line[match.end():]


def failure_excerpt(log_tail: str | None) -> LogExcerpt:
    """The exception line and the last traceback lines of a failed attempt's log.

    Lines are grouped by their rank tag first, so two ranks writing at once are told
    apart; a rank's own traceback wins over torchrun's (untagged, ``ChildFailedError``)
    one. Without a traceback, the line naming a deterministic exception or a launch
    error is the exception line. Pure; a log without any of these gives an empty excerpt.
    """
    lines = (log_tail or "").splitlines()
    by_tag: dict[str | None, list[str]] = {}
    for line in lines:
        tag, body = _untag(line.rstrip("\r"))
        by_tag.setdefault(tag, []).append(body)
    for tag, bodies in by_tag.items():
        # "[rank3]: " puts a blank after the tag on every line: it is not the line's indent.
        if tag is not None and all(body.startswith(" ") for body in bodies if body):
            by_tag[tag] = [body[1:] for body in bodies]
    candidates: list[tuple[str | None, LogExcerpt]] = []
    for tag, bodies in by_tag.items():
        excerpt = _traceback_excerpt(bodies, tag)
        if excerpt is not None:
            candidates.append((tag, excerpt))
    wrapped = [c for c in candidates if TORCHRUN_WRAPPER not in (c[1].exception or "")]
    chosen = wrapped or candidates
    if chosen:
        tagged = [c for c in chosen if c[0] is not None]
        return (tagged or chosen)[0][1]
    for tag, bodies in by_tag.items():
        for index, body in enumerate(bodies):
            if _DETERMINISTIC_LINE.match(body) or any(p.match(body) for _, p in _TAGGED_LAUNCH_ERRORS):
                # A SyntaxError has no traceback header: the indented lines above it show where.
                start = index
                while start > 0 and bodies[start - 1].startswith((" ", "\t")):
                    start -= 1
                context = tuple(bodies[max(start, index - _EXCERPT_FRAMES):index])
                return LogExcerpt(exception=body.strip(), traceback=context, tag=tag)
    return LogExcerpt(exception=None, traceback=(), tag=None)


def _traceback_excerpt(bodies: list[str], tag: str | None) -> LogExcerpt | None:
    """The last traceback in one rank's lines that is not torchrun's own wrapper (else
    the wrapper's): from its header to the first line after it that is not indented,
    where Python prints the exception."""
    found: list[LogExcerpt] = []
    index = 0
    while index < len(bodies):
        if bodies[index].strip() != TRACEBACK_HEADER:
            index += 1
            continue
        frames: list[str] = []
        index += 1
        while index < len(bodies) and (bodies[index].startswith((" ", "\t")) or not bodies[index].strip()):
            if bodies[index].strip():
                frames.append(bodies[index])
            index += 1
        if index < len(bodies) and bodies[index].strip() != TRACEBACK_HEADER:
            found.append(LogExcerpt(exception=bodies[index].strip(), traceback=tuple(frames[-_EXCERPT_FRAMES:]),
                                    tag=tag))
            index += 1
    own = [excerpt for excerpt in found if TORCHRUN_WRAPPER not in (excerpt.exception or "")]
    return (own or found or [None])[-1]
