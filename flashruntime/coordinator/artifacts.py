"""Artifacts on the coordinator's disk: key checks, bounded atomic
writes with a streaming sha256, reads and listings. Standard library only.

A write goes to a temporary file beside its target and is renamed into place after
fsync, so a reader (or a ``complete`` validating ``metrics.json``) never sees half a
file, and a crash mid-upload leaves at most a stray temp file, never a torn artifact.
A write refused after its body arrived (too large, out of scope, a clash) leaves the
previous content as it was. Below the free-space floor a write is refused before it
starts (``StorageFull``); a disk that fills during one leaves no temp file behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from flashruntime.coordinator.disk_space import space_problem
from flashruntime.errors import ArtifactConflict, ArtifactTooLarge, BadArtifactKey, FlashRuntimeError, StorageFull  # noqa: F401  (defined there, re-exported here)
from flashruntime.files import fsync_directory

__all__ = ["ArtifactConflict", "ArtifactStore", "ArtifactTooLarge", "BadArtifactKey", "check_key", "sha256_of"]

_TMP_PREFIX = ".upload-"
_BLOCK = 1 << 20  # bytes handed to the writer thread at a time
MAX_SEGMENT_BYTES = 255  # NAME_MAX of Linux file systems: one file or directory name, in bytes
# What the file system answers for a path it cannot take as a name (too long as a whole, bytes it
# will not store): the key's fault, so a 400 like any other bad key, not a 500.
_KEY_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EILSEQ})
# Digests remembered per file version (size, mtime): a listing re-hashes only what changed.
_DIGESTS_KEPT = 65_536


def check_key(key: str) -> str:
    """``key`` if it is relative, non-empty, without ``..`` segments, backslashes or a leading ``/``."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise BadArtifactKey(f"artifact key {key!r} must be a non-empty relative path without backslashes")
    parts = key.split("/")
    if any(part in ("..", ".") for part in parts) or any(not part for part in parts[:-1]):
        raise BadArtifactKey(f"artifact key {key!r} must not contain '.', '..' or empty segments")
    if not parts[-1] or parts[-1].startswith(_TMP_PREFIX):
        raise BadArtifactKey(f"artifact key {key!r} must name a file")
    for part in parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_SEGMENT_BYTES:
            raise BadArtifactKey(
                f"artifact key segment {_shortened(part)!r} is {size} bytes long; each '/'-separated segment of a "
                f"key is a file or directory name, at most {MAX_SEGMENT_BYTES} bytes (UTF-8): shorten it, or split "
                "it with '/'"
            )
    return key


def _shortened(text: str, keep: int = 40) -> str:
    return text if len(text) <= keep else f"{text[:keep]}...({len(text)} characters)"


@contextlib.contextmanager
def _key_os_errors(key: str) -> Iterator[None]:
    """An ``OSError`` the key itself causes (the path is too long as a whole, say) → ``BadArtifactKey``."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _KEY_ERRNOS:
            raise
        raise BadArtifactKey(
            f"artifact key {_shortened(key)!r} cannot be a path on the coordinator's disk: "
            f"{exc.strerror or exc}; use a shorter key (fewer or shorter segments)"
        ) from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ArtifactStore:
    """Files under ``root``, addressed by checked keys; ``min_free_bytes``: the free space
    below which writes are refused (0: none)."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int, min_free_bytes: int = 0) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.min_free_bytes = int(min_free_bytes)
        self._digests: dict[str, tuple[int, int, str]] = {}
        self._digests_lock = threading.Lock()

    def path_of(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    async def write(
        self, key: str, chunks: AsyncIterator[bytes], *, commit_check: Callable[[], None] | None = None
    ) -> tuple[str, int]:
        """Stream ``chunks`` into ``key`` atomically → (sha256, size).

        ``commit_check`` runs once the whole body is on disk, just before the rename that
        publishes it; whatever it raises propagates. Refused that way, over ``max_bytes``
        (``ArtifactTooLarge``) or clashing with existing keys (``ArtifactConflict``), the
        write removes its temp file and leaves the previous content (if any) untouched.

        Hashing, writing and the fsync run on a worker thread, a block at a time, so a large
        upload never stalls the event loop that serves every other node's heartbeats."""
        target = self.path_of(key)
        short = space_problem([self.root], self.min_free_bytes)
        if short is not None:
            raise StorageFull(errno.ENOSPC, f"artifact {key!r} was not stored: {short}")
        with _key_os_errors(key):
            self._refuse_clash(key, target)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file took a parent's place meanwhile
                self._refuse_clash(key, target)
                raise
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

            def commit() -> None:  # the check and the rename on one thread, with nothing between
                if commit_check is not None:
                    commit_check()
                try:
                    with _key_os_errors(key):
                        os.replace(tmp_name, target)
                    fsync_directory(target.parent)  # the rename, durable like every document's
                except IsADirectoryError:  # another upload made the key a directory meanwhile
                    self._refuse_clash(key, target)
                    raise

            await asyncio.to_thread(commit)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return digest.hexdigest(), size

    def write_bytes(self, key: str, data: bytes) -> tuple[str, int]:
        """``write`` for a body already in memory, from a thread that runs no event loop
        (the Ray dispatcher's): the same checks, the same atomic publish → (sha256, size)."""

        async def body() -> AsyncIterator[bytes]:
            yield data

        return asyncio.run(self.write(key, body()))

    def _refuse_clash(self, key: str, target: Path) -> None:
        """Raise ``ArtifactConflict`` when ``key`` cannot be a file: an existing artifact
        sits where one of its directories would be, or its path is a directory of other keys."""
        parent = self.root
        for part in key.split("/")[:-1]:
            parent = parent / part
            if parent.exists() and not parent.is_dir():
                existing = parent.relative_to(self.root).as_posix()
                raise ArtifactConflict(
                    f"artifact key {key!r} clashes with the existing artifact {existing!r}: a key cannot lie "
                    f"under another artifact's key; choose a key that does not start with {existing + '/'!r}"
                )
        if target.is_dir():
            inside = next((found for found, _ in self.list(key + "/")), None)
            what = f"existing artifacts under {key + '/'!r} (such as {inside!r})" if inside is not None \
                else f"the directory {key + '/'!r}"
            raise ArtifactConflict(
                f"artifact key {key!r} clashes with {what}: a key cannot also be the directory of other keys; "
                "choose another key"
            )

    def read_path(self, key: str) -> Path | None:
        path = self.path_of(key)
        with _key_os_errors(key):
            return path if path.is_file() else None

    def sha256(self, key: str) -> str | None:
        """The sha256 of artifact ``key`` as stored now; None when there is none."""
        path = self.read_path(key)
        try:
            info = path.stat() if path is not None else None
        except OSError:
            info = None
        if path is None or info is None:
            return None
        with self._digests_lock:
            known = self._digests.get(key)
        if known is not None and known[:2] == (info.st_size, info.st_mtime_ns):
            return known[2]
        try:
            digest = sha256_of(path)
        except OSError:  # replaced or removed meanwhile
            return None
        with self._digests_lock:
            if len(self._digests) >= _DIGESTS_KEPT:
                self._digests.pop(next(iter(self._digests)))
            self._digests[key] = (info.st_size, info.st_mtime_ns, digest)
        return digest

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of every file under ``prefix`` (a directory key ending in ``/``), sorted by key.
        A prefix that is not a checked key plus ``/`` raises ``BadArtifactKey``: a listing never
        leaves the directory it names."""
        if not prefix.endswith("/"):
            raise BadArtifactKey(f"artifact prefix {prefix!r} must name a directory: end it with '/'")
        base = self.path_of(prefix[:-1])
        if not base.is_dir():
            return []
        found = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(_TMP_PREFIX):
                found.append((path.relative_to(self.root).as_posix(), path.stat().st_size))
        return sorted(found)
