"""The one atomic write: the old content or the whole new one, durable, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashruntime.files import fsync_directory, write_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_atomic(target, '{"state": "RUNNING"}')
    write_atomic(target, b'{"state": "SUCCEEDED"}')
    assert target.read_text() == '{"state": "SUCCEEDED"}'
    assert [path.name for path in tmp_path.iterdir()] == ["run.json"]


def test_a_failed_write_keeps_the_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "manifest.json"
    write_atomic(target, "old")

    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and [path.name for path in tmp_path.iterdir()] == ["manifest.json"]


def test_the_directory_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if Path("/proc/self/fd").is_dir() else str(fd))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    write_atomic(tmp_path / "a.json", "x")
    assert str(tmp_path) in synced  # after the file itself
    fsync_directory(tmp_path / "missing")  # a directory that cannot be opened: nothing to do
