"""The source directory a fleet submission uploads: what goes in (git's own listing, else the
documented fallback), the caps, symlinks, and an archive the worker's extraction accepts."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from flashruntime.agent.inputs import extract_archive
from flashruntime.errors import InvalidSubmission
from flashruntime.workloads.source_archive import pack_source


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {member.name: archive.extractfile(member).read() for member in archive.getmembers()  # type: ignore[union-attr]
                if member.isfile()}


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 5000)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (root / ".venv").mkdir()
    (root / ".venv" / "python").write_text("#!")
    return root


def test_a_git_work_tree_sends_what_git_lists_and_honours_gitignore(tmp_path: Path) -> None:
    root = _tree(tmp_path / "project")
    (root / ".gitignore").write_text("data/\n__pycache__/\n.venv/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py"], check=True)  # tracked and untracked alike
    packed = pack_source(root)
    assert packed.files == [".gitignore", "pkg/model.py", "train.py"]
    assert _members(packed.data) == {".gitignore": b"data/\n__pycache__/\n.venv/\n", "pkg/model.py": b"W = 1\n",
                                     "train.py": b"print('hi')\n"}


def test_a_subdirectory_of_a_work_tree_sends_its_own_files_relative_to_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    root = _tree(repo / "sub")
    (repo / "top.py").write_text("")
    (repo / ".gitignore").write_text("data/\n__pycache__/\n.venv/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert pack_source(root).files == ["pkg/model.py", "train.py"]


def test_outside_git_the_fallback_skips_caches_environments_and_bytecode(tmp_path: Path) -> None:
    root = _tree(tmp_path / "plain")
    (root / ".git").mkdir()  # a .git that is no repository: still never sent
    (root / ".git" / "config").write_text("")
    assert pack_source(root).files == ["data/big.bin", "pkg/model.py", "train.py"]


def test_the_same_files_make_the_same_archive_and_key(tmp_path: Path) -> None:
    root = _tree(tmp_path / "plain")
    first = pack_source(root)
    os.utime(root / "train.py", (1, 1))  # a new mtime, the same content
    second = pack_source(root)
    assert first.data == second.data and first.sha256 == second.sha256
    (root / "train.py").write_text("print('changed')\n")
    assert pack_source(root).sha256 != first.sha256


def test_a_symlink_out_of_the_tree_is_left_out_and_one_inside_is_sent_as_its_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "plain")
    secret = tmp_path / "secret.txt"
    secret.write_text("key")
    (root / "leak.txt").symlink_to(secret)
    (root / "alias.py").symlink_to(root / "train.py")
    (root / "pkgs").symlink_to(root / "pkg")
    packed = pack_source(root)
    members = _members(packed.data)
    assert "leak.txt" not in members and b"key" not in b"".join(members.values())
    assert members["alias.py"] == b"print('hi')\n"
    assert dict(packed.skipped)["leak.txt"] == f"a symlink to {secret.resolve()}, outside the source directory"
    assert "pkgs" in dict(packed.skipped)


def test_the_archive_unpacks_through_the_workers_checked_extraction(tmp_path: Path) -> None:
    root = _tree(tmp_path / "plain")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(pack_source(root).data)
    extract_archive(archive, tmp_path / "out", "source")
    assert (tmp_path / "out" / "pkg" / "model.py").read_text() == "W = 1\n"
    assert os.access(tmp_path / "out" / "run.sh", os.X_OK)


def test_too_many_files_is_refused_naming_what_holds_them(tmp_path: Path) -> None:
    root = _tree(tmp_path / "plain")
    for n in range(5):
        (root / "data" / f"shard-{n}").write_text("")
    with pytest.raises(InvalidSubmission, match=r"holds 8 files, more than the 4 a submission uploads; the largest: "
                                                r"data/ \(0\.0 MiB, 6 files\).*make the directory a git work tree and "
                                                r"list them in \.gitignore.*or point --source at a smaller directory"):
        pack_source(root, max_files=4)


def test_too_many_bytes_is_refused_and_gitignore_is_the_advice_in_a_work_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path / "project")
    (root / ".gitignore").write_text("__pycache__/\n.venv/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    with pytest.raises(InvalidSubmission, match=r"holds 0\.0 MiB, more than the 0\.0 MiB a submission uploads; the "
                                                r"largest: data/ .*: add them to \.gitignore, or point --source"):
        pack_source(root, max_bytes=1000)


def test_a_source_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSubmission, match=r"is not a directory; point --source at your project directory"):
        pack_source(tmp_path / "missing")
