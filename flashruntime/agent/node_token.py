"""The worker's own credential: read from a private file, then kept out of its tasks' reach.

A token given on the command line is in every process's view (``ps``, ``/proc/<pid>/cmdline``)
and one in the environment is in ``/proc/<pid>/environ``, which stays the environment the
process started with even after ``os.environ`` forgets it. So the worker reads its token from
a file only its user can read, drops it from ``os.environ``, and makes itself non-dumpable:
same-user processes other than root can then read neither its environment nor its memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import sys
from collections.abc import MutableMapping
from pathlib import Path

from flashruntime.errors import WorkerConfigError

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "forget_token_environment", "make_non_dumpable", "read_token_file"]

TOKEN_ENV = "FLASHML_NODE_TOKEN"
TOKEN_FILE_ENV = "FLASHML_NODE_TOKEN_FILE"
_PR_SET_DUMPABLE = 4
# What the worker forgets once it has read them: its token, where it came from, the join code.
_FORGOTTEN = (TOKEN_ENV, TOKEN_FILE_ENV, "FLASHML_JOIN_CODE")


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding whitespace stripped); ``WorkerConfigError`` when the
    file is missing, empty, or readable or writable by group or others."""
    target = Path(os.path.expanduser(os.fspath(path)))
    try:
        with open(target, "rb") as handle:
            info = os.fstat(handle.fileno())
            data = handle.read(64 * 1024)
    except OSError as exc:
        raise WorkerConfigError(f"--token-file {str(target)!r} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise WorkerConfigError(f"--token-file {str(target)!r} is not a regular file; write the node token into a "
                                "file and name that")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise WorkerConfigError(f"--token-file {str(target)!r} has mode {mode:04o}, which lets group or others "
                                f"read or change it; its mode must be 0600 or stricter: chmod 600 {target}")
    token = data.decode("utf-8", "replace").strip()
    if not token:
        raise WorkerConfigError(f"--token-file {str(target)!r} is empty; write the node token into it")
    return token


def forget_token_environment(environ: MutableMapping[str, str] = os.environ) -> None:
    """Drop the worker's credentials from ``environ`` (what later children would inherit)."""
    for name in _FORGOTTEN:
        environ.pop(name, None)


def make_non_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``: the process's ``/proc`` files (environ, mem) and ptrace
    become root's only. True when set; False where the platform has no prctl."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
