"""A lease's work directory and its inputs.

``<work_dir>/<job>/<task>/<lease_id>/`` holds ``inputs/``, ``out/`` (uploaded), and beside
``out/`` the files that are not results: ``spec.json``, ``inputs.json``, ``launcher.log``,
``telemetry.jsonl``. Every name the coordinator sends must be one path segment, and an
archive with any member that would land outside its directory is refused whole.
"""

from __future__ import annotations

import json
import os
import tarfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flashruntime.client import CoordinatorClient
from flashruntime.errors import (  # noqa: F401  (defined there, re-exported here)
    CoordinatorHTTPError,
    CoordinatorUnavailable,
    FlashRuntimeError,
    TaskInterrupted,
    TaskRefused,
)

ARTIFACT_SCHEME = "artifact://"


@dataclass(frozen=True)
class LeaseDirs:
    """Paths of one lease's work directory."""

    root: Path
    ckpt: Path  # FLASHML_CKPT_DIR: task-scoped, shared by this host's successive leases of the task

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def spec_file(self) -> Path:
        return self.root / "spec.json"

    @property
    def inputs_file(self) -> Path:
        return self.root / "inputs.json"

    @property
    def log(self) -> Path:
        return self.root / "launcher.log"

    @property
    def telemetry(self) -> Path:
        return self.root / "telemetry.jsonl"


def safe_segment(value: Any, what: str) -> str:
    """``value`` as one path segment, or ``TaskRefused`` naming ``what``."""
    if (not isinstance(value, str) or not value or value in (".", "..")
            or any(ch in value for ch in ("/", "\\", "\0"))):
        raise TaskRefused(f"{what} {value!r} is not usable as a directory name (one path segment required)")
    return value


def lease_dirs(work_root: Path, job_id: str, task_id: str, lease_id: str) -> LeaseDirs:
    """Create ``<work_root>/<job>/<task>/<lease_id>/{inputs,out}`` and return its paths."""
    task_dir = work_root / safe_segment(job_id, "job id") / safe_segment(task_id, "task id")
    dirs = LeaseDirs(root=task_dir / safe_segment(lease_id, "lease id"), ckpt=task_dir / "ckpt")
    dirs.inputs.mkdir(parents=True, exist_ok=True)
    dirs.out.mkdir(parents=True, exist_ok=True)
    return dirs


def artifact_key(uri: Any, name: str) -> str:
    """The artifact key of ``artifact://<key>``; anything else refuses the task."""
    if not isinstance(uri, str) or not uri.startswith(ARTIFACT_SCHEME) or not uri[len(ARTIFACT_SCHEME):]:
        raise TaskRefused(f"input {name!r}: {uri!r} is not an artifact:// URI")
    return uri[len(ARTIFACT_SCHEME):]


def _string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskRefused(f"payload {what} must be a list of names, got {value!r}")
    return list(value)


def prepare_inputs(
    client: CoordinatorClient,
    payload: Mapping[str, Any],
    dirs: LeaseDirs,
    datasets: Mapping[str, str],
    *,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, str]:
    """Download, unpack and resolve every input; returns name → local path for spec.json."""
    inputs = payload.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise TaskRefused(f"payload inputs must be an object of name -> artifact:// URI, got {inputs!r}")
    unpack = _string_list(payload.get("unpack_inputs"), "unpack_inputs")
    local = _string_list(payload.get("local_inputs"), "local_inputs")
    for name in unpack:
        if name not in inputs:
            raise TaskRefused(f"unpack_inputs names {name!r}, which is not a declared input")
    resolved: dict[str, str] = {}
    for name in local:
        safe_segment(name, "local input")
        if name in inputs:
            raise TaskRefused(f"input {name!r} is declared both as a download and as a local dataset")
        if name not in datasets:
            raise TaskRefused(f"local input {name!r} is not a dataset of this agent (offered: {sorted(datasets)})")
        path = Path(os.path.expanduser(datasets[name])).resolve()
        if not path.exists():
            raise TaskRefused(f"local input {name!r}: dataset path {str(path)!r} does not exist on this host")
        resolved[name] = str(path)
    for name in sorted(inputs):
        if should_stop():
            raise TaskInterrupted("stopped while downloading inputs")
        safe_segment(name, "input name")
        key = artifact_key(inputs[name], name)
        target = dirs.inputs / name
        download_to = dirs.inputs / f".{name}.archive" if name in unpack else target
        try:
            client.download(key, download_to)
        except CoordinatorHTTPError as exc:
            raise TaskRefused(f"input {name!r}: download of artifact {key!r} failed: HTTP {exc.status}: "
                              f"{exc.detail}") from None
        except CoordinatorUnavailable as exc:
            raise TaskRefused(f"input {name!r}: download of artifact {key!r} failed: {exc}") from None
        if name in unpack:
            target.mkdir(exist_ok=True)
            extract_archive(download_to, target, name)
            download_to.unlink()
        resolved[name] = str(target)
    return resolved


def task_cwd(payload: Mapping[str, Any], dirs: LeaseDirs) -> Path:
    """Where the task's command runs: the unpacked input ``payload["workdir"]`` names (a job's
    source directory), else the lease directory. ``TaskRefused`` for a name that is not an
    input listed in ``unpack_inputs``."""
    name = payload.get("workdir")
    if name is None:
        return dirs.root
    inputs = payload.get("inputs")
    unpacked = _string_list(payload.get("unpack_inputs"), "unpack_inputs")
    if not isinstance(name, str) or not isinstance(inputs, dict) or name not in inputs or name not in unpacked:
        raise TaskRefused(f"payload workdir {name!r} must name an input listed in unpack_inputs (an archive the "
                          "agent unpacks), e.g. 'source'")
    return dirs.inputs / safe_segment(name, "workdir")


def write_spec(dirs: LeaseDirs, task_id: str, params: dict[str, Any], inputs: dict[str, str]) -> None:
    """``spec.json`` and ``inputs.json`` (``FLASHML_INPUTS_FILE``) beside ``out/``."""
    dirs.spec_file.write_text(json.dumps({"task_id": task_id, "params": params, "inputs": inputs}, indent=2),
                              encoding="utf-8")
    dirs.inputs_file.write_text(json.dumps(inputs, indent=2), encoding="utf-8")


# archives ---------------------------------------------------------------------------


def _check_name(name: str, archive_name: str) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and path.parts[0].endswith(":")):
        raise TaskRefused(f"input {archive_name!r}: archive member {name!r} escapes the extraction directory")


def _check_tar(members: list[tarfile.TarInfo], archive_name: str) -> None:
    for member in members:
        _check_name(member.name, archive_name)
        if member.issym() or member.islnk():
            # A link without '..' and not absolute can only point at or below its own directory.
            target = PurePosixPath(member.linkname.replace("\\", "/"))
            if target.is_absolute() or ".." in target.parts:
                raise TaskRefused(f"input {archive_name!r}: archive link {member.name!r} -> {member.linkname!r} "
                                  "escapes the extraction directory")
        elif not (member.isfile() or member.isdir()):
            raise TaskRefused(f"input {archive_name!r}: archive member {member.name!r} is a device or fifo")


def extract_archive(archive: Path, destination: Path, name: str) -> None:
    """Extract a zip or tar (any compression) into ``destination``; every member is checked
    before anything is written, and one escaping member refuses the whole archive."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as bundle:
                for info in bundle.infolist():
                    _check_name(info.filename, name)
                bundle.extractall(destination)
            return
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as bundle:
                members = bundle.getmembers()
                _check_tar(members, name)
                if hasattr(tarfile, "data_filter"):
                    bundle.extractall(destination, members=members, filter="data")
                else:  # pragma: no cover - Pythons without extraction filters; members were checked above
                    bundle.extractall(destination, members=members)
            return
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise TaskRefused(f"input {name!r}: archive could not be extracted: {exc}") from None
    raise TaskRefused(f"input {name!r} is listed in unpack_inputs but is neither a tar nor a zip archive")
