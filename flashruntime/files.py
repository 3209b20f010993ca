"""Writing a file so that a crash never leaves half of it: the one rule every writer of
a document here follows (``run.json``, a rank's heartbeat, a task's ``metrics.json``, a
checkpoint's manifest, the docs). Standard library only.

The bytes go to a temporary file beside the target; it is fsynced, renamed over the
target, and the directory is fsynced, so after a crash (of the process or the machine)
the path holds either the old content or the complete new content, and a successful
call is durable.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["fsync_directory", "write_atomic"]


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the renames and creations inside ``directory`` durable (a no-op where a
    directory cannot be opened, as on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory: nothing more can be done
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` (text is encoded with ``encoding``) atomically and
    durably. The parent directory must exist. A failure leaves ``path`` as it was and no
    temporary file behind."""
    target = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_directory(target.parent)
