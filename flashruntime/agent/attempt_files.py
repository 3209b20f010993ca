"""An attempt's files on the agent: its child started with its log (``launcher.log``), the
last line of that log (a failure's reason), the output files it left and their sha256, and
where they go on the coordinator."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

from flashruntime.agent.inputs import LeaseDirs, TaskRefused
from flashruntime.launchers.containment import AttemptContainer
from flashruntime.launchers.local import LocalLaunchHandle, open_container, read_log_tail, spawn_contained
from flashruntime.protocol.v1alpha1 import Lease

__all__ = ["REASON_LIMIT", "is_regular_file", "last_line", "last_log_line", "output_files", "payload_prefix",
           "sha256_file", "start_child"]

REASON_LIMIT = 500  # characters of a failure's reason taken from a log line


def start_child(argv: list[str], env: dict[str, str], dirs: LeaseDirs, term_grace_s: float, *,
                container: AttemptContainer | None = None, cwd: Path | None = None) -> LocalLaunchHandle:
    """Spawn as the local launcher does: no shell, own process group, stdout+stderr to ``launcher.log``,
    in ``cwd`` (default: the lease directory),
    inside ``container`` (a new one when None; see ``launchers.containment``), which the handle
    empties and releases when the attempt settles. Whatever ``argv`` starts with (a sandbox's
    own launcher included) is the process placed in the container, so all it starts is in it too."""
    if container is None:
        container = open_container(dirs.out, dirs.out.parent.name)
    with open(dirs.log, "ab") as log:
        try:
            process = spawn_contained(argv, container, cwd=cwd or dirs.root, env=env, stdout=log)
        except OSError as exc:
            raise TaskRefused(f"could not start {argv[0]!r}: {exc}") from None
        except subprocess.SubprocessError as exc:
            raise TaskRefused(f"could not start {argv[0]!r} inside its process container "
                              f"({container.describe()}): {exc}") from None
    # The handle's environment marker is FLASHML_OUTPUT_DIR=<out dir>, exactly as set above.
    return LocalLaunchHandle(process, dirs.out, term_grace_s, container=container)


def last_log_line(log: Path) -> str:
    return last_line(read_log_tail(log, 64 * 1024))


def last_line(text: str) -> str:
    """The last non-blank line of a log's text, cut to a failure reason's length."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:REASON_LIMIT] if lines else "(no output)"


def is_regular_file(path: Path) -> bool:
    """A regular file itself, not a symlink to one (a link could point anywhere on the host)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def output_files(out: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``out`` (symlinks skipped) as (relative posix path, path), sorted."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if is_regular_file(path):
                found.append((path.relative_to(out).as_posix(), path))
    return found


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def payload_prefix(lease: Lease) -> str:
    """The artifact key prefix of the lease's outputs (``jobs/<job>/<task>/`` when the payload omits it)."""
    prefix = lease.payload.get("output_prefix")
    return prefix if isinstance(prefix, str) and prefix else f"jobs/{lease.job_id}/{lease.task_id}/"
