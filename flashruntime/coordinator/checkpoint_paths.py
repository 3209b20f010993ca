"""Where a checkpoint registered over HTTP may say its files are.

A node registers the parts and commits the manifest of its own task's checkpoints, and a
later attempt (maybe another node's) restores from what the manifest names. So a part key
and a storage prefix are paths relative to the task's own checkpoint location: no leading
``/``, no ``.`` or ``..`` segments, no empty segments (so no ``scheme://``), no backslashes
or NUL, and not starting with an artifact namespace (``jobs/``, ``users/``), which would
name a place that belongs to someone else. ``PART_KEY_PATTERN`` and
``STORAGE_PREFIX_PATTERN`` say the same in the OpenAPI schema. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["NAMESPACES", "PART_KEY_PATTERN", "STORAGE_PREFIX_PATTERN", "checkpoint_path_problem"]

NAMESPACES = ("jobs", "users")  # the first segments of artifact keys, which belong to someone
_SEGMENT = r"[^/\\\x00]+"
_RELATIVE = (rf"(?!({'|'.join(NAMESPACES)})(/|$))(?!\.{{1,2}}(/|$))(?![\s\S]*/\.{{1,2}}(/|$))"
             rf"{_SEGMENT}(/{_SEGMENT})*")
PART_KEY_PATTERN = rf"^{_RELATIVE}$"
STORAGE_PREFIX_PATTERN = rf"^{_RELATIVE}/?$"
_PART_KEY = re.compile(_RELATIVE)
_STORAGE_PREFIX = re.compile(rf"{_RELATIVE}/?")


def _path_problem(what: str, path: str, form: re.Pattern[str]) -> str | None:
    if form.fullmatch(path):
        return None
    return (f"{what} {path!r} must be a path relative to the task's own checkpoint location: no leading '/', no "
            f"'.', '..' or empty segments, no backslashes, and not under {' or '.join(n + '/' for n in NAMESPACES)} "
            "(another owner's place)")


def checkpoint_path_problem(part_keys: Iterable[str], storage_prefix: str | None = None) -> str | None:
    """Why these part keys (and storage prefix) cannot be registered, or None when they can."""
    if storage_prefix is not None:
        problem = _path_problem("storage_prefix", storage_prefix, _STORAGE_PREFIX)
        if problem is not None:
            return problem
    for key in part_keys:
        problem = _path_problem("part key", key, _PART_KEY)
        if problem is not None:
            return problem
    return None
