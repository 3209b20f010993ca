"""Hashing behind local checkpoints: sha256 of files, a verification cache, and a
helper thread that hashes a part while it is being written.

The cache maps a file's identity and version — ``(st_dev, st_ino, st_size,
st_mtime_ns)`` — to the sha256 this process computed for it, so a checkpoint this
process wrote or verified is not read again. A new process starts empty.
"""

from __future__ import annotations

import collections
import hashlib
import os
import stat
import threading
from typing import Any

CHUNK = 1 << 20  # files are hashed in 1 MiB reads
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

CacheKey = tuple[int, int, int, int]


def cache_key(st: os.stat_result) -> CacheKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class VerificationCache:
    """Process-local, thread-safe, bounded (least recently used entries go first)."""

    def __init__(self, max_entries: int = 65536) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[CacheKey, str] = collections.OrderedDict()
        self._max_entries = max_entries
        self._hits = 0
        self._misses = 0
        self._hashed_files = 0
        self._hashed_bytes = 0

    def lookup(self, st: os.stat_result) -> str | None:
        key = cache_key(st)
        with self._lock:
            digest = self._entries.get(key)
            if digest is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return digest

    def record(self, st: os.stat_result, sha256: str) -> None:
        key = cache_key(st)
        with self._lock:
            self._entries[key] = sha256
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def count_hash(self, size: int) -> None:
        with self._lock:
            self._hashed_files += 1
            self._hashed_bytes += size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._hits = self._misses = self._hashed_files = self._hashed_bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "hits": self._hits,
                "misses": self._misses,
                "hashed_files": self._hashed_files,
                "hashed_bytes": self._hashed_bytes,
            }


CACHE = VerificationCache()


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only as a regular file: symlinks, FIFOs, devices and
    directories are refused (``ValueError``/``OSError``) without blocking."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{os.fspath(path)!r} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def hash_fd(fd: int, st: os.stat_result, *, use_cache: bool = True) -> str:
    """sha256 of the open regular file ``fd`` (stat ``st``): from the cache, or read in
    1 MiB chunks; a file left unchanged while it was read is cached."""
    if use_cache:
        cached = CACHE.lookup(st)
        if cached is not None:
            return cached
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total = 0
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", buffering=0, closefd=False) as raw:
        while True:
            n = raw.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            total += n
    sha = digest.hexdigest()
    CACHE.count_hash(total)
    after = os.fstat(fd)
    if cache_key(after) == cache_key(st) and total == st.st_size:
        CACHE.record(after, sha)
    return sha


class BlockPool:
    """Reusable 1 MiB buffers for data handed to the hasher: small writes coalesced
    into blocks, and private copies of buffers a writer lends only for the duration
    of ``write``. Fresh memory costs a page fault per page, which on some hosts is
    slower than the copy itself, so at most ``limit`` blocks exist at a time and the
    free ones are kept for the next part."""

    def __init__(self, block_size: int = 1 << 20, limit: int = 32) -> None:
        self.block_size = block_size
        self._limit = limit
        self._free: list[bytearray] = []
        self._out = 0
        self._lock = threading.Lock()

    def take(self) -> bytearray | None:
        """A block, or None when all ``limit`` blocks are in use."""
        with self._lock:
            if self._free:
                self._out += 1
                return self._free.pop()
            if self._out >= self._limit:
                return None
            self._out += 1
        return bytearray(self.block_size)

    def give(self, blocks: list[bytearray]) -> None:
        with self._lock:
            self._out -= len(blocks)
            self._free.extend(blocks)

    def outstanding(self) -> int:
        with self._lock:
            return self._out


POOL = BlockPool()


class _Chunk:
    __slots__ = ("view", "block")

    def __init__(self, view: memoryview, block: bytearray | None) -> None:
        self.view = view
        self.block = block  # a pool block to give back once hashed


class BackgroundHasher:
    """sha256 of a byte stream, computed on a helper thread in feed order.

    ``feed`` hands over bytes nobody changes any more (immutable ``bytes``, or a
    pool block the writer filled, given back to the pool once hashed). Hashing drops
    the GIL, so it overlaps serialisation, the write system calls and the final
    fsync; no data is read back from the file.
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Chunk] = collections.deque()
        self._closing = False
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="flashruntime-part-sha256", daemon=True)
        self._thread.start()

    def feed(self, data: Any, *, block: bytearray | None = None) -> None:
        chunk = _Chunk(memoryview(data).cast("B"), block)
        with self._cond:
            if self._closing:
                raise ValueError("the hasher is closed")
            self._queue.append(chunk)
            self._cond.notify_all()

    def wait_progress(self) -> bool:
        """Wait until the hasher finishes one more chunk; False at once if it has
        nothing queued (waiting would not free anything)."""
        with self._cond:
            if not self._queue:
                return False
            self._cond.wait()
            return True

    def hexdigest(self) -> str:
        """Wait for everything fed so far, stop the thread, return the digest."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        return self._sha.hexdigest()

    def abandon(self) -> None:
        """Stop without finishing (the part is being discarded)."""
        with self._cond:
            self._closing = True
            self._abandoned = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._closing:
                    cond.wait()
                if self._abandoned or not self._queue:
                    blocks = [chunk.block for chunk in self._queue if chunk.block is not None]
                    self._queue.clear()
                    if blocks:
                        POOL.give(blocks)
                    cond.notify_all()
                    return
                chunk = self._queue[0]
            self._sha.update(chunk.view)  # drops the GIL for large chunks
            if chunk.block is not None:
                POOL.give([chunk.block])
            with cond:
                self._queue.popleft()
                cond.notify_all()
