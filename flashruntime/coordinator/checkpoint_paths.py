"""Where a checkpoint registered over HTTP may say its files are.

A node registers the parts and commits the manifest of its own task's checkpoints, and a
later attempt (maybe another node's) restores from what the manifest names. So a part key
and a storage prefix are relative paths (no leading ``/``, no ``..`` or ``.`` segments, no
backslashes, no empty segments, so no ``scheme://``), and a key or prefix that names the
artifact namespaces (``jobs/...``, ``users/...``) must lie inside the task's own
``jobs/<job>/<task>/``. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["NAMESPACES", "checkpoint_path_problem"]

NAMESPACES = frozenset({"jobs", "users"})  # the first segments of artifact keys that belong to someone


def _path_problem(what: str, path: str, own: str, *, directory: bool) -> str | None:
    text = path[:-1] if directory and path.endswith("/") else path
    segments = text.split("/")
    if not text or path.startswith("/") or "\\" in path or "\x00" in path or any(
            segment in ("", ".", "..") for segment in segments):
        return (f"{what} {path!r} must be a relative path without '.', '..', empty segments or backslashes (it "
                f"is read under the task's own checkpoint location, never elsewhere)")
    if segments[0] in NAMESPACES and not (text + "/").startswith(own):
        return f"{what} {path!r} lies outside this task's own prefix {own!r}: name a path inside it, or a relative one"
    return None


def checkpoint_path_problem(job_id: str, task_id: str, part_keys: Iterable[str],
                            storage_prefix: str | None = None) -> str | None:
    """Why these part keys (and storage prefix) cannot be registered for ``job_id``'s task
    ``task_id``, or None when they can."""
    own = f"jobs/{job_id}/{task_id}/"
    if storage_prefix is not None:
        problem = _path_problem("storage_prefix", storage_prefix, own, directory=True)
        if problem is not None:
            return problem
    for key in part_keys:
        problem = _path_problem("part key", key, own, directory=False)
        if problem is not None:
            return problem
    return None
