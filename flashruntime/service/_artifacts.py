"""Artifacts on the coordinator's disk (SPEC §9.2, §9.7): key checks, bounded atomic
writes with a streaming sha256, reads and listings. Standard library only.

A write goes to a temporary file beside its target and is renamed into place after
fsync, so a reader (or a ``complete`` validating ``metrics.json``) never sees half a
file, and a crash mid-upload leaves at most a stray temp file, never a torn artifact.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["ArtifactStore", "ArtifactTooLarge", "BadArtifactKey", "check_key", "sha256_of"]

_TMP_PREFIX = ".upload-"
_BLOCK = 1 << 20  # bytes handed to the writer thread at a time


class BadArtifactKey(ValueError):
    """A key that is not a safe relative path (→ 400)."""


class ArtifactTooLarge(ValueError):
    """A body over ``max_bytes`` (→ 413)."""


def check_key(key: str) -> str:
    """``key`` if it is relative, non-empty, without ``..`` segments, backslashes or a leading ``/``."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise BadArtifactKey(f"artifact key {key!r} must be a non-empty relative path without backslashes")
    parts = key.split("/")
    if any(part in ("..", ".") for part in parts) or any(not part for part in parts[:-1]):
        raise BadArtifactKey(f"artifact key {key!r} must not contain '.', '..' or empty segments")
    if not parts[-1] or parts[-1].startswith(_TMP_PREFIX):
        raise BadArtifactKey(f"artifact key {key!r} must name a file")
    return key


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ArtifactStore:
    """Files under ``root``, addressed by checked keys."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)

    def path_of(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    async def write(self, key: str, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Stream ``chunks`` into ``key`` atomically → (sha256, size). Over ``max_bytes``
        raises ``ArtifactTooLarge`` and leaves the previous content (if any) untouched.

        Hashing, writing and the fsync run on a worker thread, a block at a time, so a large
        upload never stalls the event loop that serves every other node's heartbeats."""
        target = self.path_of(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=target.parent)
        digest = hashlib.sha256()
        size = 0
        pending = bytearray()
        try:
            with os.fdopen(fd, "wb") as f:

                def sink(block: bytes) -> None:
                    digest.update(block)
                    f.write(block)

                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ArtifactTooLarge(
                            f"artifact {key!r} is larger than the coordinator's limit of "
                            f"{self.max_bytes // (1024 * 1024)} MiB (FLASHML_MAX_ARTIFACT_MB)"
                        )
                    pending += chunk
                    if len(pending) >= _BLOCK:
                        await asyncio.to_thread(sink, bytes(pending))
                        pending.clear()

                def finish() -> None:
                    sink(bytes(pending))
                    f.flush()
                    os.fsync(f.fileno())

                await asyncio.to_thread(finish)
            await asyncio.to_thread(os.replace, tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return digest.hexdigest(), size

    def read_path(self, key: str) -> Path | None:
        path = self.path_of(key)
        return path if path.is_file() else None

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of every file under ``prefix`` (a directory key ending in ``/``), sorted by key."""
        base = self.root.joinpath(*[p for p in prefix.split("/") if p])
        if not base.is_dir():
            return []
        found = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(_TMP_PREFIX):
                found.append((path.relative_to(self.root).as_posix(), path.stat().st_size))
        return sorted(found)
