"""The coordinator's disk: how much room its directories have, and the errors that mean
there is none.

A full disk is an outage the caller may wait out, not a server error: ``ENOSPC`` and
``EDQUOT`` become 503 with ``Retry-After`` (the app maps them, once), uploads are refused
below the free-space floor before a byte is written, and ``/readyz`` reports the floor
until space frees. Standard library only.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from flashruntime.errors import StorageFull

__all__ = ["DISK_FULL_ERRNOS", "RETRY_AFTER_S", "free_bytes", "is_disk_full", "space_problem"]

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13  # "database or disk is full"
_POSTGRES_FULL = "53100"  # SQLSTATE disk_full
RETRY_AFTER_S = StorageFull.retry_after_s  # what a 503 for a full disk asks


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says the disk (or a quota) is full:
    ``ENOSPC``/``EDQUOT``, SQLite's ``SQLITE_FULL``, or PostgreSQL's ``disk_full`` (53100)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return True
        if getattr(current, "sqlite_errorcode", None) == _SQLITE_FULL:
            return True
        if getattr(current, "sqlstate", None) == _POSTGRES_FULL:
            return True
        current = current.__cause__ or current.__context__
    return False


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (or of its
    nearest existing parent, for a directory not made yet)."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    info = os.statvfs(where)
    return int(info.f_bavail) * int(info.f_frsize)


def space_problem(paths: Iterable[str | os.PathLike[str]], floor: int,
                  free_of: Callable[[str | os.PathLike[str]], int] = free_bytes) -> str | None:
    """Why the coordinator should not take writes now, or None: one of ``paths`` has less
    than ``floor`` bytes free (``floor`` 0: never). ``free_of`` measures a path."""
    if floor <= 0:
        return None
    for path in paths:
        try:
            free = free_of(path)
        except OSError as exc:
            return f"the free space of {str(path)!r} cannot be read: {exc.strerror or exc}"
        if free < floor:
            return (f"{str(path)!r} has {free} bytes free, below the floor of {floor} (FLASHML_MIN_FREE_BYTES): "
                    "free space there; the coordinator takes writes again by itself")
    return None
