"""Local checkpoints on disk: parts first, ``manifest.json`` last.

A step directory is a checkpoint only once its manifest exists and every part it
lists hashes to the recorded sha256. Parts are hashed while they are written
(``open_part``) and the manifest is committed by an atomic rename followed by a
directory fsync, so a crash at any instant leaves either no manifest or a complete
one. Digests this process computed are remembered in a verification cache keyed by
``(st_dev, st_ino, st_size, st_mtime_ns)``; a new process re-hashes what it selects.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import io
import os
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flashruntime.checkpoint._hashing import CACHE, POOL, BackgroundHasher, CacheKey, cache_key, hash_fd, open_regular
from flashruntime.files import write_atomic
from flashruntime.protocol.v1alpha1 import (
    CheckpointManifest,
    CheckpointPart,
    CheckpointValidation,
)

__all__ = [
    "DCP_METADATA_NAME",
    "MANIFEST_NAME",
    "clear_verification_cache",
    "latest_valid_manifest",
    "open_part",
    "read_manifest",
    "verification_cache_stats",
    "verify_manifest",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
# PyTorch Distributed Checkpoint's index of its shards: a part, though its name starts with
# the '.' that marks our temporary files.
DCP_METADATA_NAME = ".metadata"

_SMALL_WRITE = 1 << 20  # writes below this are coalesced into pool blocks
_WRITEBACK = 8 << 20  # start writeback of a part every this many bytes
_FADVISE = getattr(os, "posix_fadvise", None)
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)
_MAX_MANIFEST_BYTES = 16 << 20  # a manifest.json larger than this is not ours
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)

PathLike = str | os.PathLike[str]


def clear_verification_cache() -> None:
    """Forget every digest this process computed (as a new process would start)."""
    CACHE.clear()
    _MANIFESTS.clear()


def verification_cache_stats() -> dict[str, int]:
    """Counters of the verification cache: ``entries``, ``hits``, ``misses``,
    ``hashed_files`` and ``hashed_bytes`` (files read and hashed since the last clear)."""
    return CACHE.stats()


def _check_part_name(name: str) -> None:
    if not isinstance(name, str) or not name or name in (".", "..") or "\x00" in name:
        raise ValueError(f"part name {name!r} is not a file name")
    if os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"part name {name!r} contains a path separator; parts live directly in the step directory")
    if name.startswith(".") and name != DCP_METADATA_NAME:
        raise ValueError(f"part name {name!r} starts with '.', which marks temporary files; choose another name")
    if name == MANIFEST_NAME:
        raise ValueError(f"{MANIFEST_NAME!r} is reserved for the manifest; choose another part name")


def _is_plain_key(key: str) -> bool:
    try:
        _check_part_name(key)
    except ValueError:
        return False
    return True


def _sync_data(fd: int) -> None:
    """fsync a part's data. fdatasync skips the inode times a rename just touched, so a
    part ``open_part`` already synced costs no extra journal commit; the directory
    fsync after the manifest rename makes the renames durable."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


# --- open_part ----------------------------------------------------------------


class _PartFile(io.BufferedIOBase):
    """The writable file ``open_part`` yields. Everything written goes to the hasher in
    order; ``digest`` is ``(sha256, size)`` once the part is committed.

    ``bytes`` are handed to the hasher as they are. Any other buffer may be reused by
    the caller once ``write`` returns (``torch.save`` passes views of its own memory),
    so it is copied into pool blocks first; small writes are coalesced into blocks.
    Every ``_WRITEBACK`` bytes the kernel is asked to start writing the data back, so
    the final fsync does not have to push the whole part to disk at once.
    """

    def __init__(self, fd: int, hasher: BackgroundHasher, name: str) -> None:
        super().__init__()
        self._fd = fd
        self._hasher = hasher
        self._block: bytearray | None = None  # coalesces small writes
        self._pooled = False
        self._fill = 0
        self._size = 0
        self._on_disk = 0
        self._written_back = 0
        self._open = True
        self.name = name
        self.digest: tuple[str, int] | None = None

    # io protocol
    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        # The part is committed when the ``with open_part(...)`` block exits;
        # closing early only stops further writes.
        self._open = False

    def flush(self) -> None:
        if self._open:
            self._flush_block()

    def write(self, data: Any) -> int:
        if not self._open:
            raise ValueError("write to a closed checkpoint part")
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            data = bytes(data)
            view = memoryview(data)
        n = len(view)
        if n == 0:
            return 0
        if n < _SMALL_WRITE:
            self._coalesce(view)
        else:
            self._flush_block()
            if isinstance(data, bytes) or isinstance(view.obj, bytes):
                self._hasher.feed(view)  # immutable: the hasher may keep it
            else:
                self._copy_to_hasher(view)
            self._write_all(view)
        self._size += n
        return n

    def _take_block(self) -> tuple[bytearray, bool]:
        while True:
            block = POOL.take()
            if block is not None:
                return block, True
            if not self._hasher.wait_progress():  # nothing of ours to wait for
                return bytearray(POOL.block_size), False

    def _copy_to_hasher(self, view: memoryview) -> None:
        step = POOL.block_size
        for offset in range(0, len(view), step):
            block, pooled = self._take_block()
            try:
                piece = memoryview(block)[: min(step, len(view) - offset)]
                piece[:] = view[offset : offset + len(piece)]
                self._hasher.feed(piece, block=block if pooled else None)
            except BaseException:
                if pooled:
                    POOL.give([block])
                raise

    def _coalesce(self, view: memoryview) -> None:
        while view:
            if self._block is None:
                self._block, self._pooled = self._take_block()
                self._fill = 0
            taken = min(len(self._block) - self._fill, len(view))
            self._block[self._fill : self._fill + taken] = view[:taken]
            self._fill += taken
            view = view[taken:]
            if self._fill == len(self._block):
                self._flush_block()

    def _flush_block(self) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        data = memoryview(block)[: self._fill]
        # Written before it is handed over: the hasher gives pool blocks back when done.
        try:
            self._write_all(data)
        except BaseException:
            if self._pooled:
                POOL.give([block])
            raise
        self._hasher.feed(data, block=block if self._pooled else None)

    def _write_all(self, view: memoryview) -> None:
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._on_disk += written
        if _FADVISE is not None and self._on_disk - self._written_back >= _WRITEBACK:
            # Start writeback of what is written so far (asynchronous; fsync still decides).
            with contextlib.suppress(OSError):
                _FADVISE(self._fd, self._written_back, self._on_disk - self._written_back, _FADV_DONTNEED)
            self._written_back = self._on_disk

    # commit / abort, driven by open_part
    def _discard(self) -> None:
        self._open = False
        block, self._block = self._block, None
        if block is not None and self._pooled:
            POOL.give([block])

    def _finish(self) -> tuple[str, int, os.stat_result]:
        self._flush_block()
        self._open = False
        os.fsync(self._fd)  # the hasher finishes its backlog meanwhile
        sha = self._hasher.hexdigest()
        return sha, self._size, os.fstat(self._fd)


@contextlib.contextmanager
def open_part(step_dir: PathLike, name: str) -> Iterator[_PartFile]:
    """Write the checkpoint part ``name`` of ``step_dir``, hashing it while it is written.

    The data goes to ``<step_dir>/.<name>.tmp``; a clean exit fsyncs it, renames it
    to ``name`` and records ``(sha256, size)`` as the yielded file's ``digest`` and in
    the verification cache. An exception removes the temporary file and records nothing.
    ``step_dir`` is created if missing.
    """
    _check_part_name(name)
    step_dir = os.fspath(step_dir)
    os.makedirs(step_dir, exist_ok=True)
    tmp_path = os.path.join(step_dir, f".{name}.tmp")
    final_path = os.path.join(step_dir, name)
    fd = os.open(tmp_path, _WRITE_FLAGS, 0o644)
    hasher: BackgroundHasher | None = None
    part: _PartFile | None = None
    committed = False
    try:
        hasher = BackgroundHasher()
        part = _PartFile(fd, hasher, name)
        yield part
        sha, size, st = part._finish()
        os.close(fd)
        fd = -1
        os.replace(tmp_path, final_path)
        committed = True
        CACHE.record(st, sha)
        part.digest = (sha, size)
    finally:
        if not committed:
            if part is not None:
                part._discard()
            if hasher is not None:
                hasher.abandon()
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)


# --- write_manifest -----------------------------------------------------------


def _part_names(step_dir: str) -> list[str]:
    names = []
    with os.scandir(step_dir) as entries:
        for entry in entries:
            if entry.name == MANIFEST_NAME or (entry.name.startswith(".") and entry.name != DCP_METADATA_NAME):
                continue
            if entry.is_file(follow_symlinks=False):
                names.append(entry.name)
    return sorted(names)


def write_manifest(
    step_dir: PathLike,
    *,
    job_id: str,
    attempt_id: str,
    step: int,
    world_size: int = 1,
    framework: str = "",
    digests: Mapping[str, tuple[str, int]] | None = None,
    compatible_world_sizes: Iterable[int] | None = None,
) -> CheckpointManifest:
    """Make ``step_dir`` a checkpoint: fsync and hash its parts, then write
    ``manifest.json`` last (temporary file, fsync, rename, directory fsync).

    Parts are the regular files of ``step_dir`` except the manifest and names starting
    with ``.`` (but DCP's ``.metadata``). A part named in ``digests`` (as ``open_part`` recorded it) is only
    checked to be a regular file of the recorded size; the others are hashed, or taken
    from the verification cache. No parts, or a size mismatch → ``ValueError``.
    ``compatible_world_sizes``: the world sizes the step loads at (default: its own only);
    listing others asserts the state reshards, as replicated and DCP state do.
    """
    step_dir = os.fspath(step_dir)
    digests = dict(digests or {})
    names = _part_names(step_dir)
    if not names:
        raise ValueError(
            f"no checkpoint parts in {step_dir!r}: write at least one part (open_part) before write_manifest"
        )
    missing = sorted(set(digests) - set(names))
    if missing:
        raise ValueError(f"digests name parts that are not regular files in {step_dir!r}: {', '.join(missing)}")
    parts: list[CheckpointPart] = []
    for name in names:
        fd, st = open_regular(os.path.join(step_dir, name))
        try:
            _sync_data(fd)
            if name in digests:
                sha, size = digests[name]
                if st.st_size != size:
                    raise ValueError(
                        f"part {name!r} in {step_dir!r} has {st.st_size} bytes but its digest records {size}; "
                        "it changed after it was written"
                    )
            else:
                sha = hash_fd(fd, st)
            parts.append(CheckpointPart(key=name, sha256=sha, size_bytes=st.st_size))
        finally:
            os.close(fd)

    manifest = CheckpointManifest(
        manifest_id="ck-" + secrets.token_hex(6),
        job_id=job_id,
        attempt_id=attempt_id,
        step=step,
        framework=framework,
        world_size=world_size,
        compatible_world_sizes=sorted({world_size, *(compatible_world_sizes or ())}),
        storage_prefix=step_dir,
        parts=parts,
        validation=CheckpointValidation.HASH_VERIFIED,
    )
    # Written last, atomically and durably: it is what makes the step a checkpoint.
    write_atomic(os.path.join(step_dir, MANIFEST_NAME), manifest.model_dump_json(indent=2) + "\n")
    return manifest


# --- verification and selection -----------------------------------------------


def verify_manifest(manifest: CheckpointManifest, step_dir: PathLike) -> bool:
    """True iff every part the manifest lists is a regular file in ``step_dir`` whose
    sha256 matches (read again, or found in the verification cache). Never raises.

    A manifest that lists no parts, or a part key that is not a plain file name, does
    not verify. Extra files in ``step_dir`` are ignored.
    """
    try:
        parts = list(manifest.parts)
        if not parts:
            return False
        base = os.fspath(step_dir)
        for part in parts:
            if not _is_plain_key(part.key):
                return False
            fd, st = open_regular(os.path.join(base, part.key))
            try:
                sha = hash_fd(fd, st)
            finally:
                os.close(fd)
            if sha != str(part.sha256).lower():
                return False
        return True
    except (OSError, ValueError, TypeError, AttributeError):
        return False


class _ManifestCache:
    """Parsed manifests by file identity and version, so selection over many retained
    steps does not parse every manifest.json again. Entries are never handed out."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[CacheKey, CheckpointManifest] = collections.OrderedDict()
        self._max_entries = max_entries

    def get(self, key: CacheKey) -> CheckpointManifest | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: CacheKey, manifest: CheckpointManifest) -> None:
        with self._lock:
            self._entries[key] = manifest
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_MANIFESTS = _ManifestCache()


def read_manifest(path: str) -> CheckpointManifest | None:
    """The manifest at ``path`` (shared, do not modify), or None when it is unreadable,
    not a regular file, implausibly large or schema-invalid."""
    try:
        fd, st = open_regular(path)
    except (OSError, ValueError):
        return None
    try:
        key = cache_key(st)
        cached = _MANIFESTS.get(key)
        if cached is not None:
            return cached
        if st.st_size > _MAX_MANIFEST_BYTES:
            return None
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
        manifest = CheckpointManifest.model_validate_json(data)
        if cache_key(os.fstat(fd)) == key:
            _MANIFESTS.put(key, manifest)
        return manifest
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    finally:
        os.close(fd)


def latest_valid_manifest(ckpt_root: PathLike, pattern: str = "step-*") -> CheckpointManifest | None:
    """The verifying manifest with the highest ``step`` under ``<ckpt_root>/<pattern>/``.

    Unreadable, schema-invalid or directory-shaped ``manifest.json`` files (and those
    marked ``invalid``) are skipped. Candidates are verified newest first (ties in
    sorted path order) and the first that verifies wins, so older steps are not hashed.
    World size is not checked here. ``None`` if ``ckpt_root`` is not a directory or
    nothing verifies.
    """
    try:
        root = os.fspath(ckpt_root)
        if not os.path.isdir(root):
            return None
        paths = sorted(glob.glob(os.path.join(glob.escape(root), pattern, MANIFEST_NAME)))
    except (OSError, TypeError, ValueError):
        return None
    candidates: list[tuple[int, int, CheckpointManifest, str]] = []
    for index, path in enumerate(paths):
        manifest = read_manifest(path)
        if manifest is None or manifest.validation == CheckpointValidation.INVALID:
            continue
        candidates.append((-manifest.step, index, manifest, os.path.dirname(path)))
    candidates.sort(key=lambda item: (item[0], item[1]))
    for _, _, manifest, step_dir in candidates:
        if verify_manifest(manifest, step_dir):
            return manifest.model_copy(deep=True)
    return None
