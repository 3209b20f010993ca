"""A source directory as the tar.gz a fleet job runs in: the files ``git ls-files --cached
--others --exclude-standard`` lists (so ``.gitignore`` is honoured) in a git work tree,
else every file but ``SKIPPED_DIRS`` and ``SKIPPED_SUFFIXES``; bounded in bytes and files;
never following a symlink out of the tree. The archive is byte-for-byte the same for the
same files (sorted, mtime 0, no owners), so its sha256 names it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from flashruntime.errors import InvalidSubmission

__all__ = ["MAX_SOURCE_BYTES", "MAX_SOURCE_FILES", "SKIPPED_DIRS", "SKIPPED_SUFFIXES", "PackedSource",
           "pack_source", "source_files"]

MAX_SOURCE_BYTES = 64 * 1024 * 1024  # the files' own sizes, before compression
MAX_SOURCE_FILES = 5000
# Outside a git work tree: what no command needs from its source directory.
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache",
                          ".ruff_cache", "node_modules"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class PackedSource:
    """The archive, what is in it, and what was left out of it (path and why)."""

    data: bytes
    files: list[str]
    total_bytes: int
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _git_listing(root: Path) -> list[str] | None:
    """The files git would commit from ``root`` (tracked and untracked, minus ignored),
    relative to it; None when ``root`` is not in a git work tree or git is not installed."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                check=False, capture_output=True, text=True, timeout=60)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({os.fsdecode(name) for name in listed.stdout.split(b"\0") if name})


def _walk_listing(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):  # never into a linked directory
        dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS)
        base = Path(dirpath).relative_to(root)
        found += [(base / name).as_posix() for name in filenames if not name.endswith(SKIPPED_SUFFIXES)]
        found += [(base / name).as_posix() for name in dirnames if (Path(dirpath) / name).is_symlink()]
    return sorted(found)


def source_files(root: Path) -> tuple[list[tuple[str, Path, os.stat_result]], list[tuple[str, str]]]:
    """What ``pack_source`` would archive from ``root``: (relative path, the file whose bytes
    it takes, that file's stat) sorted, and (relative path, why) for what it leaves out. A
    symlink is archived as the regular file it points at when that lies inside ``root``;
    one pointing elsewhere, at a directory, or nowhere is left out."""
    root = root.resolve()
    listing = _git_listing(root)
    names = listing if listing is not None else _walk_listing(root)
    kept: list[tuple[str, Path, os.stat_result]] = []
    skipped: list[tuple[str, str]] = []
    for name in names:
        path = root / name
        try:
            info = os.lstat(path)
        except OSError:
            continue  # tracked but deleted from the work tree: nothing to send
        if stat.S_ISLNK(info.st_mode):
            target = Path(os.path.realpath(path))
            if not target.is_relative_to(root):
                skipped.append((name, f"a symlink to {target}, outside the source directory"))
                continue
            try:
                info = os.stat(target)
            except OSError:
                skipped.append((name, "a symlink that points nowhere"))
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append((name, "a symlink to a directory (its files are sent under their own paths)"))
                continue
            path = target
        elif not stat.S_ISREG(info.st_mode):
            continue  # a submodule's directory, a socket: no file to send
        kept.append((name, path, info))
    return kept, skipped


def _largest(files: list[tuple[str, Path, os.stat_result]], shown: int = 3) -> str:
    """The top-level entries holding most bytes, for a message saying what to exclude."""
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for name, _, info in files:
        top = name.split("/", 1)[0] + ("/" if "/" in name else "")
        sizes[top] = sizes.get(top, 0) + info.st_size
        counts[top] = counts.get(top, 0) + 1
    ranked = sorted(sizes, key=lambda top: (-sizes[top], top))[:shown]
    return ", ".join(f"{top} ({_mib(sizes[top])}, {counts[top]} file{'s' if counts[top] != 1 else ''})"
                     for top in ranked)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def pack_source(root: str | Path, *, max_bytes: int = MAX_SOURCE_BYTES,
                max_files: int = MAX_SOURCE_FILES) -> PackedSource:
    """``root``'s files as a deterministic tar.gz (see the module). ``InvalidSubmission`` for a
    root that is no directory, or holds more than ``max_files`` files or ``max_bytes`` bytes,
    naming the entries that hold the most and how to leave them out."""
    directory = Path(os.path.expanduser(str(root)))
    if not directory.is_dir():
        raise InvalidSubmission(f"source directory {str(directory)!r} is not a directory; point --source at your "
                                "project directory")
    files, skipped = source_files(directory)
    total = sum(info.st_size for _, _, info in files)
    if len(files) > max_files or total > max_bytes:
        how = ("add them to .gitignore" if _git_listing(directory.resolve()) is not None else
               f"move them out, or make the directory a git work tree and list them in .gitignore (outside git "
               f"only {', '.join(sorted(SKIPPED_DIRS))} and *.pyc are left out)")
        over = (f"{len(files)} files, more than the {max_files}" if len(files) > max_files
                else f"{_mib(total)}, more than the {_mib(max_bytes)}")
        raise InvalidSubmission(
            f"source directory {str(directory)!r} holds {over} a submission uploads; the largest: "
            f"{_largest(files)}: {how}, or point --source at a smaller directory")
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, path, info in files:
            member = tarfile.TarInfo(name)
            member.size, member.mtime = info.st_size, 0
            member.mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
            with open(path, "rb") as handle:
                archive.addfile(member, handle)
    return PackedSource(buffer.getvalue(), [name for name, _, _ in files], total, skipped)
