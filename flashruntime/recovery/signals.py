"""Signals from a finished local process: its exit code and the tail of its log decide
whether the failure would recur on retry, and whether it failed reading a checkpoint back.

Pure. Only ``exit_code``, ``exit_deterministic`` and ``validation_failed`` are ever set; the
log text is not copied into ``message``, so it can never trigger the comm/storage markers.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import NamedTuple

from flashruntime.recovery.taxonomy import FailureSignals

__all__ = [
    "CHECKPOINT_LOAD_ERRORS",
    "DETERMINISTIC_EXCEPTIONS",
    "PEER_LOSS",
    "TASK_INPUT_ERRORS",
    "TASK_MODULES",
    "PeerLossRule",
    "LAUNCH_ERRORS",
    "LAUNCH_ERROR_EXIT_CODES",
    "LaunchErrorRule",
    "LogExcerpt",
    "checkpoint_load_failure",
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

# The task modules of ``flashml_workloads`` report a failure as one line, ``<module>: <Type>:
# <message>`` (``sgd_trainer: ValueError: params.steps is required``). These types say the task
# itself is wrong (its parameters, its input's contents): it would fail the same way anywhere.
TASK_MODULES = ("sgd_trainer", "sklearn_trial", "kmeans_shard", "fedavg_worker")
TASK_INPUT_ERRORS = ("ValueError", "TypeError", "KeyError", "IndexError", "JSONDecodeError")
_TASK_MODULE_ERROR = re.compile(
    r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)*(?:flashml_workloads\.)?(" + "|".join(TASK_MODULES) + r"): "
    r"(" + "|".join(TASK_INPUT_ERRORS + DETERMINISTIC_EXCEPTIONS) + r"): ",
    re.MULTILINE,
)
# argparse's own refusal of the command line: a "usage: ..." line, then "<prog>: error: ...", exit 2.
_USAGE_LINE = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)*usage: ")
_USAGE_ERROR_LINE = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)*\S+: error: \S")
ARGPARSE_EXIT_CODE = 2
# What of a log is judged: its end, in lines no longer than this (a crafted log must never make
# the judging slow; what decides a failure is in its last lines).
JUDGED_BYTES = 64 * 1024
JUDGED_LINE_CHARS = 4096


class PeerLossRule(NamedTuple):
    """An exception that a surviving process raises because another process of the job died
    (not because of its own code): named by ``words``, matched by ``pattern`` on the exception
    line, as in ``example``. A named group ``rank`` or ``signal`` says which process and how."""

    words: str
    pattern: str
    example: str


PEER_LOSS: tuple[PeerLossRule, ...] = (
    PeerLossRule("torch.multiprocessing.spawn saw a rank killed",
                 r"ProcessExitedException: process (?P<rank>[0-9]+) terminated with signal (?P<signal>SIG[A-Z0-9]+)",
                 "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL"),
    PeerLossRule("a launched process was killed",
                 r"CalledProcessError: Command .* died with <Signals\.(?P<signal>SIG[A-Z0-9]+): [0-9]+>",
                 "subprocess.CalledProcessError: Command '['python', 't.py']' died with <Signals.SIGKILL: 9>."),
    PeerLossRule("a peer closed its gloo connection",
                 r"^(?:[A-Za-z_.]*\.)?(?:RuntimeError|DistBackendError|DistNetworkError): "
                 r"\[[^\]\n]{0,300}gloo[^\]\n]{0,300}\] Connection (?:closed|reset) by peer",
                 "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:31916"),
    PeerLossRule("a peer went away mid-collective",
                 r"^(?:[A-Za-z_.]*\.)?(?:RuntimeError|DistBackendError|DistNetworkError): [^\n]{0,500}?"
                 r"(?:Connection reset by peer|Broken pipe|NCCL communicator was aborted|remote process exited"
                 r"|ncclRemoteError)",
                 "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error"),
)
_PEER_LOSS = tuple((rule.words, re.compile(rule.pattern)) for rule in PEER_LOSS)

# An exception line saying a checkpoint file could not be read back: the file is bad, and
# every relaunch that loads it would fail the same way.
CHECKPOINT_LOAD_ERRORS = (
    r"PytorchStreamReader failed reading", r"failed finding central directory", r"SafetensorError",
    r"Error while deserializing header", r"HeaderTooLarge", r"MetadataIncompleteBuffer",
    r"BadZipFile: File is not a zip file",
)
_CHECKPOINT_LOAD = re.compile("|".join(CHECKPOINT_LOAD_ERRORS))

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


def judged_text(log_tail: str | None) -> str:
    """The part of a log the rules read: its last ``JUDGED_BYTES``, each line cut at
    ``JUDGED_LINE_CHARS``, with plain line breaks."""
    tail = (log_tail or "")[-JUDGED_BYTES:]
    return "\n".join(line[:JUDGED_LINE_CHARS] for line in tail.splitlines())


def _usage_error(text: str) -> bool:
    """argparse's refusal: a ``usage:`` line with a ``<prog>: error: ...`` line after it."""
    lines = text.splitlines()
    usage = next((index for index, line in enumerate(lines) if _USAGE_LINE.match(line)), None)
    return usage is not None and any(_USAGE_ERROR_LINE.match(line) for line in lines[usage + 1:])


def _verdict(exit_code: int | None, log_tail: str | None) -> tuple[bool, str]:
    """(deterministic, a few words naming the evidence)."""
    if exit_code is None:
        return False, "no exit code"
    if exit_code == 0:
        return False, "exit 0"
    text = judged_text(log_tail)
    match = _DETERMINISTIC_LINE.search(text)
    if match:
        return True, f"{match.group(1)} at line start"
    for words, pattern in _TAGGED_LAUNCH_ERRORS:
        if pattern.search(text):
            return True, f"{words}: exit {exit_code}"
    if exit_code in LAUNCH_ERROR_EXIT_CODES:
        return True, f"exit {exit_code} ({LAUNCH_ERROR_EXIT_CODES[exit_code]})"
    task_error = _TASK_MODULE_ERROR.search(text)
    if task_error:
        return True, f"{task_error.group(1)} refused its task: {task_error.group(2)}"
    if exit_code == ARGPARSE_EXIT_CODE and _usage_error(text):
        return True, "the command line was refused (usage error, exit 2)"
    wrapped = TORCHRUN_WRAPPER in text
    if TRACEBACK_HEADER in text and not wrapped:
        peer = _peer_loss(text)
        if peer is not None:
            return False, peer
        return True, "traceback without ChildFailedError"
    if exit_code < 0:
        return False, f"killed by {_signal_name(-exit_code)}"
    if wrapped:
        return False, "torchrun ChildFailedError" + _torchrun_root_cause(text)
    if 128 < exit_code < 128 + 65:
        return False, f"exit {exit_code} (128 + {_signal_name(exit_code - 128)})"
    return False, f"exit {exit_code} without a traceback"


# torchrun's failure report: the "Root Cause (first observed failure):" block names the rank,
# its exit code and pid in the lines after it ("rank      : 1 (local_rank: 1)", "exitcode  : -9 (pid: 6042)").
_ROOT_CAUSE = "Root Cause (first observed failure):"
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>[0-9]+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?[0-9]+)\s*\(pid:\s*(?P<pid>[0-9]+)\)")
_ROOT_CAUSE_LINES = 8


def _torchrun_root_cause(text: str) -> str:
    """``": root cause rank 1 (pid 6042) killed by SIGKILL"`` from torchrun's report, or ""."""
    lines = text.splitlines()
    start = next((index for index in range(len(lines) - 1, -1, -1) if _ROOT_CAUSE in lines[index]), None)
    if start is None:
        return ""
    block = lines[start + 1:start + 1 + _ROOT_CAUSE_LINES]
    rank = next((m.group("rank") for line in block if (m := _ROOT_RANK.match(line))), None)
    exit_match = next((m for line in block if (m := _ROOT_EXIT.match(line))), None)
    if rank is None or exit_match is None:
        return ""
    code = int(exit_match.group("code"))
    how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit {code}"
    return f": root cause rank {rank} (pid {exit_match.group('pid')}) {how}"


def _exception_lines(text: str) -> list[str]:
    """The exception line of every traceback in ``text``, each rank's read apart (by its tag)."""
    found = []
    for bodies in _lines_by_rank(text).values():
        index = 0
        while index < len(bodies):
            if bodies[index].strip() != TRACEBACK_HEADER:
                index += 1
                continue
            index += 1
            while index < len(bodies) and (bodies[index].startswith((" ", "\t")) or not bodies[index].strip()):
                index += 1
            if index < len(bodies) and bodies[index].strip() != TRACEBACK_HEADER:
                found.append(bodies[index].strip())
    return found


def _peer_loss(text: str) -> str | None:
    """When every traceback in ``text`` is a survivor's reaction to another process of the job
    dying (``PEER_LOSS``), the words naming that, with the rank and signal where the launcher
    said them; None when any traceback is of the code's own making (that is the root cause)."""
    exceptions = _exception_lines(text)
    if not exceptions:
        return None
    named: list[str] = []
    for exception in exceptions:
        match = next(((words, m) for words, pattern in _PEER_LOSS if (m := pattern.search(exception))), None)
        if match is None:
            return None
        words, found = match
        groups = found.groupdict()
        who = f"rank {groups['rank']}" if groups.get("rank") else "a process"
        how = f" by {groups['signal']}" if groups.get("signal") else ""
        named.append(f"peer lost: {words} ({who} killed{how})" if how else f"peer lost: {words}")
    return next((words for words in named if " killed by " in words), named[0])


def checkpoint_load_failure(log_tail: str | None) -> str | None:
    """The exception line of a traceback that failed reading a checkpoint back (a torn zip,
    a bad safetensors header, a truncated pickle), or None."""
    return next((line for line in _exception_lines(judged_text(log_tail)) if _CHECKPOINT_LOAD.search(line)), None)


def from_local_launch(exit_code: int | None, log_tail: str | None) -> FailureSignals:
    """Signals of a finished local process. Deterministic iff, in this order: a line
    starts with one of ``DETERMINISTIC_EXCEPTIONS`` (after ``[rankN]:``-style tags); a
    line shows the command could not start (``LAUNCH_ERRORS``); the exit code is one a
    shell gives a command it cannot run (``LAUNCH_ERROR_EXIT_CODES``); a task module of
    ``flashml_workloads`` refused its task (``TASK_MODULES``, ``TASK_INPUT_ERRORS``); argparse
    refused the command line (exit 2 after a usage line); or a traceback appears without
    torchrun's ``ChildFailedError`` wrapper, unless every traceback is a survivor's reaction to
    a lost peer (``PEER_LOSS``: a killed rank, a closed gloo connection). Transient otherwise."""
    if exit_code not in (None, 0) and checkpoint_load_failure(log_tail) is not None:
        return FailureSignals(exit_code=exit_code, validation_failed=True)
    deterministic, _ = _verdict(exit_code, log_tail)
    return FailureSignals(exit_code=exit_code, exit_deterministic=deterministic)


def describe_launch(exit_code: int | None, log_tail: str | None) -> str:
    """A few words naming the evidence behind ``from_local_launch`` for the same
    arguments, e.g. ``"ModuleNotFoundError at line start"``, ``"killed by SIGKILL"``."""
    if exit_code not in (None, 0):
        loading = checkpoint_load_failure(log_tail)
        if loading is not None:
            return f"a checkpoint could not be loaded: {loading[:200]}"
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


def _lines_by_rank(text: str) -> dict[str | None, list[str]]:
    """The lines of ``text`` grouped by their rank tag (None: untagged), tags removed, so
    two ranks writing at once are read apart."""
    by_tag: dict[str | None, list[str]] = {}
    for line in text.splitlines():
        tag, body = _untag(line.rstrip("\r"))
        by_tag.setdefault(tag, []).append(body)
    for tag, bodies in by_tag.items():
        # "[rank3]: " puts a blank after the tag on every line: it is not the line's indent.
        if tag is not None and all(body.startswith(" ") for body in bodies if body):
            by_tag[tag] = [body[1:] for body in bodies]
    return by_tag


def failure_excerpt(log_tail: str | None) -> LogExcerpt:
    """The exception line and the last traceback lines of a failed attempt's log.

    Lines are grouped by their rank tag first, so two ranks writing at once are told
    apart; a rank's own traceback wins over torchrun's (untagged, ``ChildFailedError``)
    one. Without a traceback, the line naming a deterministic exception or a launch
    error is the exception line. Pure; a log without any of these gives an empty excerpt.
    """
    by_tag = _lines_by_rank(judged_text(log_tail))
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
